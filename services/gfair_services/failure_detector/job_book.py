"""The failure detector's view of every live job: where it runs, its attempt, its retries.

An exit is classified by `gfair.core.failure.classify` and decided by `failure_decision`;
this book supplies the facts (attempt, retries so far, last checkpoint) and keeps the outcome.
Hung jobs (no progress for `hang_after_s` while running) are killed and decided like an
infrastructure failure; copies a node runs of jobs that live elsewhere are fenced (killed).
It reads no clock: `now` is an argument.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from gfair.core.failure import Classification, ExitFacts, classify
from gfair.core.retry import RetryPolicy
from gfair.events.commands import KillCommand
from gfair.events.fields import JobRef
from gfair.events.jobs import (
    JobCancelled,
    JobCheckpointed,
    JobExited,
    JobMigrated,
    JobProgress,
    JobResumed,
    JobStarted,
    JobSuspended,
)
from gfair.events.reasons import FailureClass
from gfair.events.states import JobState
from gfair.events.submission import JobSubmitted
from gfair.state.buckets import job_key
from gfair.state.job_failures import FailureDecision, JobFailureRecord
from gfair.state.node_record import NodeFailureEntry
from gfair_services.failure_detector.change import NO_CHANGE, Change
from gfair_services.failure_detector.failure_decision import decide_failure, noted


@dataclass(frozen=True, slots=True)
class ExitVerdict:
    change: Change
    # An infrastructure failure to hold against the node the job ran on.
    node_failure: NodeFailureEntry | None = None


@dataclass(frozen=True, slots=True)
class Hang:
    """A running job that stopped making progress: `cause` names this run, for stable ids."""

    job: JobRef
    cause: str
    change: Change
    correlation_id: str | None = None


class JobBook:
    def __init__(self, policy: RetryPolicy, *, hang_after_s: float) -> None:
        self._policy = policy
        self._hang_after_s = hang_after_s
        self._records: dict[str, JobFailureRecord] = {}
        # node id -> keys of the records running there: a failed node's jobs are found without
        # a look at every job (a thousand nodes failing at once, each a pass over 20,000 jobs,
        # held a detector up for minutes).
        self._on: dict[str, set[str]] = {}
        # Progress is too frequent to write down: it lives here, and a restart grants every
        # running job a fresh `hang_after_s` from `restore`.
        self._last_progress: dict[str, float] = {}
        # The steps and checkpoint a running job's progress last reported, not yet in its
        # record: a report every few seconds per job is a dict update, and the record takes them in
        # only when it is read to be changed (`_live`), so they are written with its next change.
        self._progress: dict[str, tuple[int, int | None]] = {}

    # ----- state -------------------------------------------------------------------------

    def restore(self, records: Iterable[JobFailureRecord], now: datetime) -> None:
        for record in records:
            if record.terminal is None:
                self.add(record, now)

    def add(self, record: JobFailureRecord, now: datetime) -> None:
        self._put(record)
        if record.running_on is not None:
            self._last_progress[record.key] = now.timestamp()

    def knows(self, user: str, job_id: str) -> bool:
        return job_key(user, job_id) in self._records

    def get(self, user: str, job_id: str) -> JobFailureRecord | None:
        return self._current(job_key(user, job_id))

    def _current(self, key: str) -> JobFailureRecord | None:
        """The record of `key` with the progress reported since it last changed."""
        record = self._records.get(key)
        progress = self._progress.pop(key, None)
        if record is None or progress is None:
            return record
        iterations, step = progress
        record = record.model_copy(
            update={
                "iterations": iterations,
                "last_checkpoint_step": _later(record.last_checkpoint_step, step),
            }
        )
        self._records[key] = record
        return record

    def apply(self, change: Change, now: datetime) -> None:
        for record in change.jobs:
            previous = self._records.get(record.key)
            if record.terminal is not None:
                # Done: kept in the bucket; a late event for it is looked up there again.
                self._drop(record.key)
                self._last_progress.pop(record.key, None)
                self._progress.pop(record.key, None)
                continue
            self._put(record)
            started = previous is None or record.running_since != previous.running_since
            if record.running_on is not None and started:
                self._last_progress[record.key] = now.timestamp()
            elif record.running_on is None:
                self._last_progress.pop(record.key, None)

    def _put(self, record: JobFailureRecord) -> None:
        self._drop(record.key)
        self._records[record.key] = record
        if record.running_on is not None:
            self._on.setdefault(record.running_on, set()).add(record.key)

    def _drop(self, key: str) -> None:
        record = self._records.pop(key, None)
        if record is None or record.running_on is None:
            return
        keys = self._on.get(record.running_on)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._on[record.running_on]

    def _keys_on(self, node_id: str) -> list[str]:
        """The keys of the live records running on `node_id`, in key order."""
        return sorted(
            key for key in self._on.get(node_id, ()) if self._records[key].terminal is None
        )

    def running_on(self, node_id: str) -> tuple[JobRef, ...]:
        return tuple(
            JobRef(user=r.user, job_id=r.job_id)
            for r in map(self._records.__getitem__, self._keys_on(node_id))
        )

    def live(self) -> int:
        return sum(1 for r in self._records.values() if r.terminal is None)

    # ----- lifecycle ---------------------------------------------------------------------

    def submitted(self, data: JobSubmitted, now: datetime) -> Change:
        # The first submission of an id is the one admitted; later ones are rejected duplicates.
        record = self._live(data.user, data.job_id)
        if record is None or record.submitted_at is not None:
            return NO_CHANGE
        update = {"submitted_at": now, "max_retries": data.max_retries}
        return Change(jobs=(record.model_copy(update=update),))

    def started(
        self, data: JobStarted | JobResumed, correlation_id: str | None, now: datetime
    ) -> Change:
        record = self._live(data.user, data.job_id)
        if record is None or data.attempt < record.attempt:
            return NO_CHANGE
        update: dict[str, object] = {
            "attempt": data.attempt,
            "running_on": data.node_id,
            "running_since": now,
            "first_started_at": record.first_started_at or now,
            "correlation_id": record.correlation_id or correlation_id,
        }
        if isinstance(data, JobResumed) and data.checkpoint_step is not None:
            update["last_checkpoint_step"] = _later(
                record.last_checkpoint_step, data.checkpoint_step
            )
        return Change(jobs=(record.model_copy(update=update),))

    def progressed(self, data: JobProgress, now: datetime) -> None:
        key = job_key(data.user, data.job_id)
        record = self._records.get(key)
        if (
            record is None
            or record.terminal is not None
            or record.running_on != data.node_id
            or data.attempt != record.attempt
        ):
            return
        self._last_progress[key] = now.timestamp()
        known = self._progress.get(key)
        step = data.checkpoint_step if known is None else _later(known[1], data.checkpoint_step)
        self._progress[key] = (data.iterations, step)

    def checkpointed(self, data: JobCheckpointed) -> Change:
        record = self._live(data.user, data.job_id)
        if record is None:
            return NO_CHANGE
        step = _later(record.last_checkpoint_step, data.step)
        if step == record.last_checkpoint_step:
            return NO_CHANGE
        return Change(jobs=(record.model_copy(update={"last_checkpoint_step": step}),))

    def stopped(self, data: JobSuspended | JobMigrated) -> Change:
        record = self._live(data.user, data.job_id)
        node = data.node_id if isinstance(data, JobSuspended) else data.from_node
        # A late report from a node the job has since left says nothing about where it is now.
        if record is None or data.attempt < record.attempt or record.running_on not in (None, node):
            return NO_CHANGE
        return Change(
            jobs=(
                record.model_copy(
                    update={
                        "running_on": None,
                        "running_since": None,
                        "last_checkpoint_step": _later(
                            record.last_checkpoint_step, data.checkpoint_step
                        ),
                    }
                ),
            )
        )

    def cancelled(self, data: JobCancelled, now: datetime) -> Change:
        record = self._live(data.user, data.job_id)
        if record is None:
            return NO_CHANGE
        return Change(
            jobs=(
                record.model_copy(
                    update={
                        "terminal": JobState.CANCELLED,
                        "ended_at": now,
                        "running_on": None,
                        "running_since": None,
                    }
                ),
            )
        )

    def node_lost(self, node_id: str, now: datetime) -> Change:
        """The node failed: its jobs no longer run; placement re-places them."""
        records = []
        for key in self._keys_on(node_id):
            record = self._current(key)
            assert record is not None
            step = record.last_checkpoint_step
            reason = f"node {node_id} failed; placement re-places the job, " + (
                "from scratch" if step is None else f"resuming from step {step}"
            )
            records.append(
                noted(
                    record.model_copy(update={"running_on": None, "running_since": None}),
                    FailureDecision(
                        time=now,
                        attempt=record.attempt,
                        outcome="node_lost",
                        failure_class=FailureClass.INFRASTRUCTURE,
                        reason=reason,
                        node_id=node_id,
                        resume_from_step=step,
                    ),
                )
            )
        return Change(jobs=tuple(records))

    # ----- decisions ---------------------------------------------------------------------

    def exited(self, data: JobExited, now: datetime) -> ExitVerdict:
        record = self._live(data.user, data.job_id)
        if record is None or data.attempt < record.attempt:
            return ExitVerdict(NO_CHANGE)  # after the job's end, or of an attempt already decided
        if record.running_on not in (None, data.node_id):
            # A copy left on a node it was taken from (declared failed, re-placed meanwhile):
            # the job lives on elsewhere; that copy's end decides nothing.
            return ExitVerdict(NO_CHANGE)
        # The exit may be the first the detector hears of this attempt (its start was lost).
        record = record.model_copy(update={"attempt": data.attempt})
        classification = classify(
            ExitFacts(
                exit_code=data.exit_code,
                signal=data.signal,
                stderr_tail=data.stderr_tail,
                xids=tuple(data.xid_errors),
            )
        )
        change = decide_failure(record, classification, data.node_id, now, self._policy, exit=data)
        entry = None
        if classification.kind is FailureClass.INFRASTRUCTURE:
            entry = NodeFailureEntry(
                time=now,
                failure_class=FailureClass.INFRASTRUCTURE,
                reason=classification.reason,
                user=data.user,
                job_id=data.job_id,
            )
        return ExitVerdict(change, entry)

    def fence(
        self, node_id: str, running: Iterable[JobRef], now: datetime, *, grace_s: float
    ) -> Change:
        """Kill copies a node still runs of jobs that ended or run elsewhere.

        A node declared failed may only have been cut off: when its heartbeats come back, the
        jobs it lists may have been re-placed and restarted elsewhere, and must not run twice.
        `grace_s` lets a migration's last heartbeats from the old node pass.
        """
        kills: list[KillCommand] = []
        for job in running:
            record = self._records.get(job_key(job.user, job.job_id))
            if record is None:
                continue
            started_before = None
            if record.terminal is not None:
                reason = f"the job is {record.terminal.value}"
            elif (
                record.running_on not in (None, node_id)
                and record.running_since is not None
                and (now - record.running_since).total_seconds() > grace_s
            ):
                reason = (
                    f"the job runs on {record.running_on} since "
                    f"{record.running_since.isoformat()}; this copy must not run twice"
                )
                # Reports on two streams arrive in no common order: a copy that started after
                # the start heard of here is the job's newest run, not one left behind.
                started_before = record.running_since
            else:
                continue
            kills.append(
                KillCommand(
                    node_id=node_id,
                    user=job.user,
                    job_id=job.job_id,
                    # Attempts only grow: the copy's attempt is at most the job's.
                    attempt=record.attempt,
                    reason=reason,
                    started_before=started_before,
                )
            )
        return Change(events=tuple(kills))

    def hung(self, now: datetime) -> list[Hang]:
        hangs: list[Hang] = []
        for key, record in sorted(self._records.items()):
            if record.running_on is None or record.terminal is not None:
                continue
            since = self._last_progress.get(key, now.timestamp())
            silent = now.timestamp() - since
            if silent <= self._hang_after_s:
                continue
            record = self._current(key) or record
            node_id = record.running_on
            assert node_id is not None  # progress folded in moves no job
            reason = (
                f"no progress for {silent:.0f}s while running on {node_id} "
                f"(hung after {self._hang_after_s:g}s)"
            )
            kill = KillCommand(
                node_id=node_id,
                user=record.user,
                job_id=record.job_id,
                attempt=record.attempt,
                reason=reason,
            )
            classification = Classification(FailureClass.INFRASTRUCTURE, reason, "hang")
            decided = decide_failure(record, classification, node_id, now, self._policy, exit=None)
            started = record.running_since.isoformat() if record.running_since else "-"
            hangs.append(
                Hang(
                    job=JobRef(user=record.user, job_id=record.job_id),
                    cause=f"hang/{key}/{record.attempt}/{started}",
                    change=Change(events=(kill,)) + decided,
                    correlation_id=record.correlation_id,
                )
            )
        return hangs

    def _live(self, user: str, job_id: str) -> JobFailureRecord | None:
        record = self._current(job_key(user, job_id))
        if record is None:
            record = JobFailureRecord(user=user, job_id=job_id)
        return None if record.terminal is not None else record


def _later(known: int | None, seen: int | None) -> int | None:
    if seen is None:
        return known
    return seen if known is None else max(known, seen)


__all__ = ["ExitVerdict", "Hang", "JobBook"]
