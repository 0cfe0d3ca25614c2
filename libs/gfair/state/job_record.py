"""What placement keeps in `gfair_jobs` (its only writer): one `JobRecord` per job.

Key ``<user>.<job_id>`` (`gfair.state.buckets.job_key`). The record holds the submission as the
user made it (the node executor's `StartCommand` is built from it), the job's current state,
pool and servers, attempt and last checkpoint, and the decisions taken about it with their
reasons, newest last, for `gfair why`.

The state follows the job's lifecycle events: `JobRecord.apply` folds one in (each event class
names the state it leads to, `JOB_STATE`). Folding is idempotent by event id (a redelivered
event changes nothing) and a terminal state is final (a late `suspended` after `cancelled` does
not revive the job).

Tools read records with `load_job` / `load_jobs`; only placement writes them (`save_job`, a
revision-checked write, so a second writer loses instead of overwriting).

Accounting (`gfair history`, `gfair usage`) comes from the same folding: the record keeps when
the job first ran and, per GPU generation, the GPU-seconds it held (its GPUs times the time it
was running there). An interval opens when a process of the job starts on some node, in the
generation it was placed in, and closes when none runs any more, by whatever path (suspended,
migrated, a lost node, a retry); a re-placement while it still runs (the record then says
`placed`) charges the old generation until the process lets go. A job that ended with an
interval open (a cancellation) is charged up to its end.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from pydantic import AwareDatetime, Field, computed_field

from gfair.events.envelope import Envelope
from gfair.events.fields import (
    Attempt,
    Generation,
    GpuCount,
    JobId,
    Name,
    NodeId,
    Step,
    Tickets,
    UserName,
)
from gfair.events.job_array import ArrayMembership
from gfair.events.jobs import (
    JobAccepted,
    JobCheckpointed,
    JobEvent,
    JobFailed,
    JobLaunch,
    JobMigrated,
    JobPlaced,
    JobProgress,
    JobRejected,
    JobResumed,
    JobRetried,
    JobStarted,
    JobSuspended,
)
from gfair.events.reasons import FailureClass, RejectionCode
from gfair.events.states import JobState
from gfair.events.submission import JobSubmitted
from gfair.state.buckets import JOBS, UnreadableRecord, job_key, read_record
from gfair.state.record import Record

# Decisions kept per record (oldest dropped first): enough to explain a job's recent life.
MAX_DECISIONS = 64
# Event ids remembered per record for idempotent folding; redeliveries come soon after.
MAX_APPLIED_IDS = 32


class Submission(JobLaunch):
    """The job as its user submitted it (`JobSubmitted`), and the envelope that carried it."""

    event_id: str = Field(description="Envelope id of the JobSubmitted; a redelivery repeats it")
    submitted_at: AwareDatetime
    trace_parent: str | None = Field(
        default=None,
        description="W3C traceparent of the job's trace (placement's handling of the "
        "submission); events about the job that no job event caused join that trace",
    )
    gpus: GpuCount
    tickets: Tickets | None = None
    job_type: Name | None = None
    name: Name | None = None
    max_retries: int | None = None
    array: ArrayMembership | None = None
    after_ok: tuple[JobId, ...] = ()
    prepare: bool = False

    @classmethod
    def of(
        cls, envelope: Envelope, data: JobSubmitted, trace_parent: str | None = None
    ) -> Submission:
        return cls(
            event_id=envelope.id,
            submitted_at=envelope.time,
            trace_parent=trace_parent,
            **dict(JobLaunch.from_fields(data)),
            gpus=data.gpus,
            tickets=data.tickets,
            job_type=data.job_type,
            name=data.name,
            max_retries=data.max_retries,
            array=data.array,
            after_ok=data.after_ok,
            prepare=data.prepare,
        )

    @property
    def weight(self) -> float:
        """Weight among the user's jobs: equal unless the user says (docs/design.md §1.1)."""
        return self.tickets if self.tickets is not None else 1.0


class DecisionEntry(Record):
    """One thing the scheduler decided about the job, and why (a line of `gfair why`)."""

    at: AwareDatetime
    kind: str = Field(description="admission, placement, pending, migration, lifecycle, ...")
    text: str
    rule: str | None = Field(default=None, description="The placement rule that decided")


class Accounting(Record):
    """When the job ran and the GPU time it held, per generation (see the module's docstring)."""

    started_at: AwareDatetime | None = Field(default=None, description="When it first ran")
    gpu_seconds: dict[Generation, float] = Field(
        default_factory=dict, description="GPUs x seconds running, per generation, closed intervals"
    )
    running_since: AwareDatetime | None = Field(
        default=None, description="Start of the interval it is running now, if it is"
    )
    running_generation: Generation | None = None

    def opened(self, at: datetime, generation: str | None) -> Accounting:
        if self.running_since is not None:
            return self
        return self.model_copy(
            update={
                "started_at": self.started_at or at,
                "running_since": at,
                "running_generation": generation,
            }
        )

    def closed(self, at: datetime, gpus: int) -> Accounting:
        if self.running_since is None:
            return self
        return self.model_copy(
            update={
                "gpu_seconds": self.charged_until(at, gpus),
                "running_since": None,
                "running_generation": None,
            }
        )

    def charged_until(self, at: datetime, gpus: int) -> dict[str, float]:
        """GPU-seconds per generation, with the open interval (if any) counted up to `at`."""
        totals = dict(self.gpu_seconds)
        if self.running_since is not None:
            pool = self.running_generation or "unknown"
            held = max((at - self.running_since).total_seconds(), 0.0) * gpus
            totals[pool] = totals.get(pool, 0.0) + held
        return totals


class JobRecord(Record):
    user: UserName
    job_id: JobId
    state: JobState
    submission: Submission
    generation: Generation | None = Field(default=None, description="Pool it is placed in")
    servers: tuple[NodeId, ...] = Field(default=(), description="Servers it is placed on")
    nodes: tuple[NodeId, ...] = Field(default=(), description="Nodes its processes run on now")
    attempt: Attempt = 1
    last_checkpoint_step: Step | None = None
    resume_from_step: Step | None = None
    rejection_code: RejectionCode | None = None
    cancelled_from: JobState | None = Field(default=None, description="State when cancelled")
    failure_class: FailureClass | None = None
    reason: str | None = Field(default=None, description="Why it was rejected, failed, ...")
    created_at: AwareDatetime
    updated_at: AwareDatetime
    decisions: tuple[DecisionEntry, ...] = ()
    accounting: Accounting = Field(default_factory=Accounting)
    applied_event_ids: tuple[str, ...] = Field(
        default=(), description="Recently folded event ids (idempotency)"
    )

    @property
    def key(self) -> str:
        return job_key(self.user, self.job_id)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ended_at(self) -> datetime | None:
        """When it ended (its last change, once terminal), None while it lives."""
        return self.updated_at if self.state.terminal else None

    def gpu_seconds(self, now: datetime) -> dict[str, float]:
        """GPU-seconds per generation, a running job's current interval counted up to `now`."""
        return self.accounting.charged_until(self.ended_at or now, self.gpus)

    def accounted(self, at: datetime) -> JobRecord:
        """The record with its running interval opened or closed at `at`: open while some node
        runs a process of the job."""
        if self.state.terminal:
            accounting = self.accounting  # charged up to its end when read (`gpu_seconds`)
        elif self.nodes:
            accounting = self.accounting.opened(at, self.generation)
        else:
            accounting = self.accounting.closed(at, self.gpus)
        if accounting is self.accounting:
            return self
        return self.model_copy(update={"accounting": accounting})

    @property
    def gpus(self) -> int:
        return self.submission.gpus

    @property
    def live(self) -> bool:
        return not self.state.terminal

    @property
    def pending(self) -> bool:
        """Admitted but on no servers (nothing fitting was up); placement retries it."""
        return self.live and not self.servers

    def admission(self) -> JobAccepted:
        """The job's admission, with what scheduling and starting it need."""
        sub = self.submission
        return JobAccepted(
            user=self.user,
            job_id=self.job_id,
            gpus=sub.gpus,
            job_type=sub.job_type,
            array=sub.array,
            launch=JobLaunch.from_fields(sub),
            tickets=sub.tickets,
            prepare=sub.prepare,
            attempt=self.attempt,
        )

    @classmethod
    def accepted(
        cls, envelope: Envelope, data: JobSubmitted, *, trace_parent: str | None = None
    ) -> JobRecord:
        """The record of a freshly admitted job: queued, on no servers yet."""
        return cls(
            user=data.user,
            job_id=data.job_id,
            state=JobState.QUEUED,
            submission=Submission.of(envelope, data, trace_parent),
            created_at=envelope.time,
            updated_at=envelope.time,
            applied_event_ids=(envelope.id,),
        )

    @classmethod
    def rejected(
        cls, envelope: Envelope, data: JobSubmitted, code: RejectionCode, reason: str
    ) -> JobRecord:
        record = cls.accepted(envelope, data).model_copy(
            update={"state": JobState.REJECTED, "rejection_code": code, "reason": reason}
        )
        return record.with_decision(envelope.time, "admission", f"rejected ({code}): {reason}")

    def with_decision(
        self, at: datetime, kind: str, text: str, rule: str | None = None
    ) -> JobRecord:
        decisions = (*self.decisions, DecisionEntry(at=at, kind=kind, text=text, rule=rule))
        return self.model_copy(
            update={"decisions": decisions[-MAX_DECISIONS:], "updated_at": max(at, self.updated_at)}
        )

    def placed(self, at: datetime, generation: str, servers: Sequence[str]) -> JobRecord:
        state = JobState.PLACED if self.state in (JobState.QUEUED, JobState.PLACED) else self.state
        return self.model_copy(
            update={
                "generation": generation,
                "servers": tuple(servers),
                "state": state,
                "updated_at": max(at, self.updated_at),
            }
        )

    def unplaced(self, at: datetime) -> JobRecord:
        """Off its servers (one failed or was quarantined); waits for new ones."""
        return self.model_copy(update={"servers": (), "updated_at": max(at, self.updated_at)})

    def lost_node(self, node_id: str, at: datetime) -> JobRecord:
        """Its process on `node_id` is gone with the node; with no process left it waits."""
        nodes = tuple(n for n in self.nodes if n != node_id)
        state = self.state
        if state is JobState.RUNNING and not nodes:
            state = JobState.PLACED if self.servers else JobState.QUEUED
        return self.model_copy(
            update={"nodes": nodes, "state": state, "updated_at": max(at, self.updated_at)}
        ).accounted(at)

    def noting(self, event_id: str) -> JobRecord:
        """The record remembering that handling `event_id` changed it (replays re-emit)."""
        if event_id in self.applied_event_ids:
            return self
        ids = (*self.applied_event_ids, event_id)[-MAX_APPLIED_IDS:]
        return self.model_copy(update={"applied_event_ids": ids})

    def seen(self, event_id: str) -> bool:
        return event_id in self.applied_event_ids

    def apply(self, envelope: Envelope, event: JobEvent) -> JobRecord | None:
        """The record after `event`, or None when it changes nothing (repeat, or job over)."""
        if self.seen(envelope.id) or self.state.terminal:
            return None
        update: dict[str, object] = {}
        at = envelope.time
        forced: str | None = None  # a forced yield's line in the job's decisions
        if event.JOB_STATE is not None and event.JOB_STATE is not JobState.SUBMITTED:
            update["state"] = event.JOB_STATE
        match event:
            case JobStarted() | JobResumed():
                update["nodes"] = tuple(sorted({*self.nodes, event.node_id}))
                update["attempt"] = max(self.attempt, event.attempt)
                if isinstance(event, JobResumed) and event.checkpoint_step is not None:
                    update["last_checkpoint_step"] = event.checkpoint_step
            case JobSuspended():
                if event.forced:
                    forced = _forced_yield(event)
                update["nodes"] = tuple(n for n in self.nodes if n != event.node_id)
                if event.checkpoint_step is not None:
                    update["last_checkpoint_step"] = event.checkpoint_step
                if self.nodes and set(self.nodes) - {event.node_id}:
                    # Other parts of a multi-server gang still run: not suspended yet as a whole.
                    update["state"] = self.state
            case JobMigrated():
                update["nodes"] = tuple(n for n in self.nodes if n != event.from_node)
                if event.checkpoint_step is not None:
                    update["last_checkpoint_step"] = event.checkpoint_step
                # Placement already moved it; the executor confirming the release changes no
                # placement.
                update["state"] = JobState.PLACED if self.servers else JobState.QUEUED
            case JobCheckpointed():
                update["last_checkpoint_step"] = max(self.last_checkpoint_step or 0, event.step)
            case JobProgress():
                if event.checkpoint_step is not None:
                    update["last_checkpoint_step"] = event.checkpoint_step
            case JobRetried():
                update["attempt"] = max(self.attempt, event.attempt)
                update["nodes"] = ()
                update["resume_from_step"] = event.resume_from_step
                update["failure_class"] = event.failure_class
                update["reason"] = event.reason
            case JobFailed():
                update["nodes"] = ()
                update["failure_class"] = event.failure_class
                update["reason"] = event.reason
            case JobRejected():
                update["rejection_code"] = event.code
                update["reason"] = event.reason
            case JobPlaced():
                update["servers"] = event.servers
                update["generation"] = event.generation
            case _:
                if event.JOB_STATE is not None and event.JOB_STATE.terminal:
                    update["nodes"] = ()
        if not update:
            return None
        update["applied_event_ids"] = (*self.applied_event_ids, envelope.id)[-MAX_APPLIED_IDS:]
        update["updated_at"] = max(at, self.updated_at)
        updated = self.model_copy(update=update)
        if forced is not None:
            updated = updated.with_decision(at, "yield", forced)
        if updated.state.terminal and self.accounting.running_since is not None:
            # Charged up to the event that ended it, not to a later change of the record.
            return updated.model_copy(update={"accounting": self.accounting.closed(at, self.gpus)})
        return updated.accounted(at)

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> JobRecord:
        return cls.model_validate_json(raw)


def _forced_yield(event: JobSuspended) -> str:
    """What its owner reads of a yield the node had to force (`gfair job`, `gfair why`)."""
    overran = f", {event.overrun_s:.1f}s past its grace" if event.overrun_s is not None else ""
    kept = (
        f"it resumes from checkpoint step {event.checkpoint_step}"
        if event.checkpoint_step is not None
        else "it had no checkpoint and restarts from the beginning"
    )
    return (
        f"forced off {event.node_id}: it did not checkpoint and yield when asked{overran}, so "
        f"it was killed; {kept} (progress since is lost) and its user was charged for the "
        "GPU time it held"
    )


# --- reading and writing the bucket ------------------------------------------------------


class StoredValue(Protocol):
    """What a key-value read returns (`gfair.bus.KvEntry` is one)."""

    @property
    def value(self) -> bytes: ...

    @property
    def revision(self) -> int: ...


class RecordBucket(Protocol):
    """The part of a key-value bucket the record helpers use (`gfair.bus.KeyValue` is one)."""

    async def get(self, key: str) -> StoredValue | None: ...

    async def create(self, key: str, value: bytes) -> int: ...

    async def update(self, key: str, value: bytes, revision: int) -> int: ...

    async def keys(self) -> list[str]: ...


class StoredJob(Record):
    record: JobRecord
    revision: int


def _stored_job(key: str, entry: StoredValue) -> StoredJob:
    record = read_record(JobRecord, JOBS.name, key, entry.value, entry.revision)
    return StoredJob(record=record, revision=entry.revision)


async def load_job(bucket: RecordBucket, user: str, job_id: str) -> StoredJob | None:
    """The job's record; `UnreadableRecord` if what is stored under its key is not one."""
    key = job_key(user, job_id)
    entry = await bucket.get(key)
    if entry is None or not entry.value:
        return None
    return _stored_job(key, entry)


async def load_jobs(
    bucket: RecordBucket,
    *,
    user: str | None = None,
    unreadable: list[UnreadableRecord] | None = None,
) -> list[StoredJob]:
    """Every job's record (or `user`'s), in key order; a value that is no record is passed
    over (and added to `unreadable`), so one bad key hides no other job."""
    prefix = f"{user}." if user is not None else ""
    found: list[StoredJob] = []
    for key in await bucket.keys():
        if not key.startswith(prefix):
            continue
        entry = await bucket.get(key)
        if entry is None or not entry.value:
            continue
        try:
            found.append(_stored_job(key, entry))
        except UnreadableRecord as error:
            if unreadable is not None:
                unreadable.append(error)
    return found


async def save_job(bucket: RecordBucket, record: JobRecord, revision: int | None) -> int:
    """Write `record`: create it (`revision` None) or update it at `revision`.

    Returns the new revision; the bucket's conflict error (`gfair.bus.KvConflict`) propagates
    when the key exists (create) or moved on (update).
    """
    if revision is None:
        return await bucket.create(record.key, record.to_bytes())
    return await bucket.update(record.key, record.to_bytes(), revision)
