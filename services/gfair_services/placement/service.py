"""The placement service: admission and the job records.

Where and when an admitted job runs is the decision kernel's (split-stride drives it each
quantum and announces every placement with `JobPlaced`); placement admits a job when some
registered pool could ever run it (`feasibility`), refuses it with a reason otherwise, and keeps
each job's `JobRecord` current, placements included.

Consumers (durable, one worker each, so each reads its events in stream order):

- ``placement-jobs`` (GFAIR_JOBS): submissions, cancel requests, and the lifecycle events that
  keep each `JobRecord`'s state current (placements by split-stride among them);
- ``placement-nodes`` (GFAIR_NODES): the node inventory (registrations and health verdicts).

Dependencies (`after_ok`) are placement's too, since it holds every job's record and so every
outcome; the admission machine (`gfair.core.admission`, which the simulator drives too) decides
them, told every record placement takes: a submission naming a job id its user has no job
under, or a job that already failed, was cancelled or rejected, is rejected; one whose
dependencies all completed is admitted as any other; any other is admitted as `held`
(`JobHeld`), which no other service takes for runnable work. When a job ends (`JobCompleted`,
`JobFailed`, or a cancel handled here), the jobs held for it are decided again: released with
`JobAccepted` once every dependency completed, or cancelled with the reason when one will never
complete, which in turn decides the jobs held for them. Dependents are written before the
record of the job that ended, each noting the event, so a redelivery after a crash re-announces
what was decided (and decides what a crash left held).

State lives in `gfair_jobs` (this service is its only writer); the node inventory is rebuilt on
start from the stream's history. The handlers share one lock.

Handlers write a record before returning the events that announce it, and the runtime publishes
those before acknowledging the input. A crash in between redelivers the input; the record then
already says the input was handled (`applied_event_ids`, the submission's event id), and the
handler returns the same announcements again, which JetStream drops as duplicates (same derived
event ids) or consumers ignore (they are idempotent by state).

A submission under an id with no record yet (placement writes every record, so it knows them
all) has its record created without waiting: the creates of a batch go out together and are
awaited when the batch settles (`settle`), before the runtime publishes the announcements. Any
later write of such a record first waits for its create. If a create fails, the book takes the
record as stored (or forgets it) and the submission's batch is handled again, also when a later
write (a cancel in the same batch, a node's failure) saw the failure first.
"""

from __future__ import annotations

import asyncio

import structlog
from opentelemetry import trace

from gfair.bus.dead_letter import set_aside
from gfair.bus.key_value import KeyValue, KvConflict
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.service import Emit, Service
from gfair.bus.tracing import current_traceparent
from gfair.bus.transport import BusError
from gfair.core.admission import (
    Admit,
    Admitter,
    Arrived,
    Cancel,
    DependencyOutcome,
    Finished,
    Hold,
    Known,
    Purged,
    Refuse,
)
from gfair.core.kernel import Pass
from gfair.core.throughput import ThroughputEstimator
from gfair.events.commands import KillCommand
from gfair.events.envelope import Clock, Envelope, EventData, utc_now
from gfair.events.jobs import (
    JobCancelled,
    JobCheckpointed,
    JobCompleted,
    JobEvent,
    JobFailed,
    JobHeld,
    JobMigrated,
    JobPlaced,
    JobRejected,
    JobResumed,
    JobRetried,
    JobStarted,
    JobSuspended,
)
from gfair.events.nodes import NodeEvent
from gfair.events.reasons import RejectionCode
from gfair.events.states import JobState, NodeState
from gfair.events.subjects import NODES_STREAM, parse_cancel_subject, parse_submit_subject
from gfair.events.submission import JobCancelRequested, JobSubmitted
from gfair.state import buckets
from gfair.state.buckets import UnreadableRecord, job_key
from gfair.state.job_record import JobRecord, load_job, load_jobs, save_job
from gfair_services.inventory import INVENTORY_EVENTS, NodeInventory
from gfair_services.profiler.seed import seed_table
from gfair_services.skeleton import Consumes, Every, declare, started

from .admission import Refusal, answer_invalid_submission, check_pending, check_submission
from .book import LiveJobs
from .feasibility import unsatisfiable
from .settings import PlacementSettings

SERVICE_NAME = "placement"

JOB_EVENTS: tuple[type[EventData], ...] = (
    JobSubmitted,
    JobCancelRequested,
    JobPlaced,
    JobStarted,
    JobResumed,
    JobSuspended,
    JobMigrated,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobRetried,
)

_log = structlog.get_logger("gfair.placement")
_tracer = trace.get_tracer("gfair.placement")


class PlacementService:
    def __init__(
        self, settings: PlacementSettings, estimator: ThroughputEstimator, clock: Clock = utc_now
    ) -> None:
        self.settings = settings
        self.estimator = estimator
        self.clock = clock
        self.book = LiveJobs()
        self.inventory = NodeInventory()
        self._lock = asyncio.Lock()
        self._kv: KeyValue | None = None
        # Keys `gfair_jobs` holds (this service writes them all): a submission under any other
        # id creates its record without a conflict to expect.
        self._stored: set[str] = set()
        # Records being created: the record sent and the write in flight, by job key.
        self._creating: dict[str, tuple[JobRecord, asyncio.Task[int]]] = {}
        # Creates that failed since the jobs' batch last settled, by job key. Whoever awaited
        # one first (a cancel of the job in the same batch, a node's failure), the batch of the
        # submission that made it must fail too, or its admission would be announced for a
        # record that does not exist.
        self._failed_creates: dict[str, BaseException] = {}
        # Dependencies: told every record the book takes, so it knows every job's outcome.
        self.admission = Admitter()

    def service(self) -> Service:
        """The `Service` running this state's handlers."""
        return declare(
            SERVICE_NAME,
            self.settings,
            start=self.start,
            consumes=(
                # A submission the contract refuses never reaches the handler: answer it here.
                Consumes(
                    "jobs",
                    self.on_job_event,
                    JOB_EVENTS,
                    settle=self.settle,
                    on_invalid=answer_invalid_submission,
                ),
                Consumes("nodes", self.on_node_event, INVENTORY_EVENTS),
            ),
            timers=(Every("job-retention", self.settings.retention_check_s, self.purge),),
        )

    @property
    def kv(self) -> KeyValue:
        return started(self._kv, "placement (its gfair_jobs bucket)")

    # -- start: rebuild from the bucket and the streams --------------------------------------

    async def start(self, runtime: ServiceRuntime) -> None:
        self._kv = await runtime.key_value(buckets.JOBS.name)
        unreadable: list[UnreadableRecord] = []
        for stored in await load_jobs(self._kv, unreadable=unreadable):
            self._stored.add(stored.record.key)
            self._take(stored.record, stored.revision)
        for error in unreadable:
            await set_aside(runtime.bus, error, service=SERVICE_NAME)
        async for past in runtime.history(
            NODES_STREAM.name,
            filter_subjects=tuple(m.subject_pattern() for m in INVENTORY_EVENTS),
            accepts=INVENTORY_EVENTS,
        ):
            if isinstance(past.data, NodeEvent):
                self.inventory.apply(past.envelope, past.data)
        _log.info(
            "placement state rebuilt",
            live_jobs=len(self.book),
            nodes=len(self.inventory),
        )

    # -- handlers -----------------------------------------------------------------------------

    async def on_job_event(self, envelope: Envelope, data: EventData) -> list[Emit]:
        async with self._lock:
            if isinstance(data, JobSubmitted):
                return await self._submit(envelope, data)
            if isinstance(data, JobCancelRequested):
                return await self._cancel(envelope, data)
            if isinstance(data, JobEvent):
                return await self._lifecycle(envelope, data)
            return []

    async def on_node_event(self, envelope: Envelope, data: EventData) -> list[Emit]:
        async with self._lock:
            if isinstance(data, NodeEvent):
                change = self.inventory.apply(envelope, data)
                if change is not None:
                    _log.info(
                        "node changed",
                        node_id=change.node_id,
                        before=change.before,
                        after=change.after,
                    )
                    if change.after is NodeState.FAILED:
                        await self._lose_node(envelope, change.node_id)
            return []

    # -- submissions ---------------------------------------------------------------------------

    async def _submit(self, envelope: Envelope, data: JobSubmitted) -> list[Emit]:
        at = envelope.time
        subject_user = parse_submit_subject(envelope.subject)
        refusal = check_submission(data, subject_user, self.settings)
        if refusal is not None and refusal.code is RejectionCode.USER_MISMATCH:
            # The runtime refuses such payloads before they get here; this guards direct calls.
            # No record: the job id belongs to neither user's namespace with certainty.
            return [Emit(JobRejected(user=subject_user, job_id=data.job_id, **_why(refusal)))]
        live = self.book.get(f"{data.user}.{data.job_id}")
        if live is not None:
            if live.record.submission.event_id == envelope.id:
                return _submission_outputs(live.record)  # a redelivery
            return [_duplicate(live.record)]
        over = refusal or check_pending(data.user, self.book.unfinished(data.user), self.settings)
        if over is not None and over.code is RejectionCode.TOO_MANY_PENDING:
            # No record: a flood of these must not grow the bucket (the rejection is the answer).
            return [Emit(JobRejected(user=data.user, job_id=data.job_id, **_why(over)))]
        # Later events about the job (a placement once GPUs free up, a move) join this trace.
        record = JobRecord.accepted(envelope, data, trace_parent=current_traceparent())
        if refusal is None:
            reason = unsatisfiable(data.gpus, data.job_type, self.inventory, self.estimator)
            if reason is not None:
                refusal = Refusal(RejectionCode.UNSATISFIABLE, reason)
        refused = None if refusal is None else (refusal.code, refusal.reason)
        submitted = Arrived(data.user, data.job_id, tuple(data.after_ok), refusal=refused)
        match self.admission.apply(submitted)[0]:
            case Refuse(code=code, reason=reason):
                candidate = JobRecord.rejected(envelope, data, RejectionCode(code), reason)
            case Hold(reason=reason):
                candidate = record.model_copy(update={"state": JobState.HELD}).with_decision(
                    at, "held", f"{_admitted(data)}; held, {reason}"
                )
            case _:
                candidate = record.with_decision(at, "admission", _admitted(data))
        if candidate.key not in self._stored:
            self._create_soon(candidate)
            return _handled(candidate)
        try:
            revision = await save_job(self.kv, candidate, None)
        except KvConflict:
            existing = await load_job(self.kv, data.user, data.job_id)
            if existing is None:
                self.admission.apply(Purged(((data.user, data.job_id),)))
                raise  # deleted in between: the redelivery will find it free
            self._take(existing.record, existing.revision)  # admission is told it as stored
            if existing.record.submission.event_id == envelope.id:
                candidate, revision = existing.record, existing.revision  # a redelivery
            elif existing.record.state is JobState.REJECTED:
                # A rejected job never ran: its id may be used again.
                revision = await save_job(self.kv, candidate, existing.revision)
            else:
                return [_duplicate(existing.record)]
        self._take(candidate, revision)
        return _handled(candidate)

    # -- cancellation --------------------------------------------------------------------------

    async def _cancel(self, envelope: Envelope, data: JobCancelRequested) -> list[Emit]:
        if parse_cancel_subject(envelope.subject) != data.user:
            return []  # the runtime refuses these too: a user cancels only its own jobs
        stored = self.book.get(f"{data.user}.{data.job_id}") or await load_job(
            self.kv, data.user, data.job_id
        )
        if stored is None:
            _log.info("cancel of an unknown job", user=data.user, job_id=data.job_id)
            return []
        record = stored.record
        if record.state is JobState.CANCELLED and record.seen(envelope.id):
            return _cancel_outputs(record) + await self._decide_dependents(record, envelope)
        if not record.live:
            _log.info("cancel of a finished job", user=data.user, job_id=data.job_id)
            return []
        at = envelope.time
        reason = data.reason or f"cancelled by {data.user}"
        cancelled = (
            record.model_copy(
                update={
                    "state": JobState.CANCELLED,
                    "cancelled_from": record.state,
                    "reason": reason,
                }
            )
            .noting(envelope.id)
            .with_decision(at, "cancel", f"cancelled while {record.state}: {reason}")
        )
        outputs = await self._decide_dependents(cancelled, envelope)
        await self._save(cancelled, stored.revision)
        return _cancel_outputs(cancelled) + outputs

    # -- lifecycle -----------------------------------------------------------------------------

    async def _lifecycle(self, envelope: Envelope, data: JobEvent) -> list[Emit]:
        stored = self.book.get(f"{data.user}.{data.job_id}")
        if stored is None:
            return []  # unknown, or finished: its record already holds its final state
        record = stored.record
        updated = record.apply(envelope, data)
        if updated is None:
            return []
        at = envelope.time
        for node_id in updated.nodes:
            entry = self.inventory.get(node_id)
            if entry is not None and entry.state is NodeState.FAILED:
                # Reported before the node was declared dead: that process is gone with it.
                updated = updated.lost_node(node_id, at)
        match data:
            case JobPlaced():
                updated = updated.with_decision(at, "placement", _placed_text(data))
            case JobRetried():
                updated = updated.with_decision(
                    at,
                    "retry",
                    f"attempt {data.attempt} after {data.delay_s:.3g}s "
                    f"({data.failure_class}): {data.reason}",
                )
            case JobFailed():
                updated = updated.with_decision(
                    at, "failed", f"{data.failure_class}: {data.reason}"
                )
            case JobCompleted():
                updated = updated.with_decision(
                    at, "completed", f"attempt {data.attempt} succeeded"
                )
        outputs: list[Emit] = []
        if not updated.live:
            outputs = await self._decide_dependents(updated, envelope)
        await self._save(updated, stored.revision)
        return outputs

    # -- dependencies --------------------------------------------------------------------------

    def _take(self, record: JobRecord, revision: int) -> None:
        """The book takes `record`, and admission what it says of the job's dependencies."""
        self.book.put(record, revision)
        held = record.state is JobState.HELD
        outcome = None if held else _OUTCOMES.get(record.state, DependencyOutcome.PENDING)
        after_ok = tuple(record.submission.after_ok)
        self.admission.apply(Known(record.user, record.job_id, after_ok, outcome))

    async def _decide_dependents(self, ended: JobRecord, envelope: Envelope) -> list[Emit]:
        """Release or cancel the jobs held for `ended` (which is not written yet), and so on
        down their chains; the announcements. A dependent that already noted `envelope` was
        decided by an earlier delivery of it: its announcement is made again, and what it
        decides in turn is decided (again)."""
        outputs: list[Emit] = []
        for job_id in sorted(self.admission.dependents(ended.user, ended.job_id)):
            stored = self.book.get(job_key(ended.user, job_id)) or await load_job(
                self.kv, ended.user, job_id
            )
            if stored is not None and stored.record.seen(envelope.id):
                outputs += _decided_outputs(stored.record)
                if not stored.record.live:
                    outputs += await self._decide_dependents(stored.record, envelope)
        at = envelope.time
        given = Finished(ended.user, ended.job_id, _OUTCOMES[ended.state])
        for decision in self.admission.apply(given):
            stored = self.book.get(job_key(decision.user, decision.job_id)) or await load_job(
                self.kv, decision.user, decision.job_id
            )
            if stored is None:
                continue
            record = stored.record
            if isinstance(decision, Admit):
                decided = record.model_copy(update={"state": JobState.QUEUED}).with_decision(
                    at, "admission", f"released: {decision.released}"
                )
            elif isinstance(decision, Cancel):
                reason = f"cancelled: {decision.reason}"
                decided = record.model_copy(
                    update={
                        "state": JobState.CANCELLED,
                        "cancelled_from": JobState.HELD,
                        "reason": reason,
                    }
                ).with_decision(at, "cancel", reason)
            else:
                continue
            decided = decided.noting(envelope.id)
            await self._save(decided, stored.revision)
            outputs += _decided_outputs(decided)
        return outputs

    # -- node changes --------------------------------------------------------------------------

    async def _lose_node(self, envelope: Envelope, node_id: str) -> None:
        """The processes of a failed node are gone: the records say so (the kernel places the
        jobs elsewhere)."""
        at = envelope.time
        for stored in list(self.book):
            if node_id in stored.record.nodes:
                await self._save(stored.record.lost_node(node_id, at), stored.revision)

    # -- retention -----------------------------------------------------------------------------

    async def purge(self) -> list[Emit]:
        """Delete the records of jobs that ended more than `job_retention_s` ago. Their events
        stay in `GFAIR_JOBS` for its own age limit; a later submission may reuse the id, and one
        naming such a job in `after_ok` is refused as naming no job."""
        async with self._lock:
            cutoff = self.settings.retention_cutoff(self.clock())
            purged = set(await self.book.ended.purge(self.kv, cutoff))
            self._stored -= purged
            gone = (key.partition(".") for key in sorted(purged))
            self.admission.apply(Purged(tuple((user, job) for user, _, job in gone)))
        return []

    # -- writes --------------------------------------------------------------------------------

    def _create_soon(self, record: JobRecord) -> None:
        """Send the create of `record`'s first version; the batch's settling awaits it."""
        self._stored.add(record.key)
        write = asyncio.get_running_loop().create_task(save_job(self.kv, record, None))
        self._creating[record.key] = (record, write)
        self._take(record, -1)

    async def _created(self, key: str) -> int:
        """Wait for the create of `key`; its revision, which the book takes if still current."""
        record, write = self._creating[key]
        try:
            revision = await write
        except Exception as error:
            if self._creating.get(key, (None, None))[1] is write:
                del self._creating[key]
                self._failed_creates[key] = error
                await self._reread(key)
            raise
        if self._creating.get(key, (None, None))[1] is write:
            del self._creating[key]
            stored = self.book.get(key)
            if stored is not None and stored.record is record:
                self._take(record, revision)
        return revision

    async def _reread(self, key: str) -> None:
        """The book takes `key`'s record as stored, after a write whose outcome is unknown."""
        user, _, job_id = key.partition(".")
        self.book.remove(key)
        try:
            fresh = await load_job(self.kv, user, job_id)
        except BusError as error:
            # The redelivered event finds the key taken and reads it then.
            _log.warning("cannot reread a job record", job=key, error=str(error))
            return
        if fresh is not None:
            self._take(fresh.record, fresh.revision)

    async def settle(self) -> None:
        """Every record create sent so far done; raises (after fixing the book) if one failed
        since the last settling, here or wherever it was awaited first."""
        async with self._lock:
            creating = list(self._creating)
            await asyncio.gather(*(self._created(key) for key in creating), return_exceptions=True)
            failed, self._failed_creates = self._failed_creates, {}
        if failed:
            raise next(iter(failed.values()))

    async def _save(self, record: JobRecord, revision: int | None) -> int:
        if record.key in self._creating:
            revision = await self._created(record.key)
        try:
            new_revision = await save_job(self.kv, record, revision if revision != -1 else None)
        except KvConflict:
            # Someone else wrote it (a second placement?): take theirs and let the runtime retry.
            fresh = await load_job(self.kv, record.user, record.job_id)
            if fresh is None:
                self.book.remove(record.key)
                self.admission.apply(Purged(((record.user, record.job_id),)))
            else:
                self._take(fresh.record, fresh.revision)
            raise
        self._stored.add(record.key)
        self._take(record, new_revision)
        return new_revision


def _why(refusal: Refusal) -> dict[str, object]:
    return {"code": refusal.code, "reason": refusal.reason}


def _duplicate(existing: JobRecord) -> Emit:
    reason = (
        f"job id {existing.job_id} is already used by {existing.user}'s {existing.state} job "
        f"submitted at {existing.submission.submitted_at.isoformat()}"
    )
    return Emit(
        JobRejected(
            user=existing.user,
            job_id=existing.job_id,
            code=RejectionCode.DUPLICATE_JOB_ID,
            reason=reason,
        )
    )


# What a dependency's record state says of it; a live state is pending.
_OUTCOMES = {
    JobState.COMPLETED: DependencyOutcome.COMPLETED,
    JobState.FAILED: DependencyOutcome.FAILED,
    JobState.CANCELLED: DependencyOutcome.CANCELLED,
    JobState.REJECTED: DependencyOutcome.REJECTED,
}


def _decided_outputs(record: JobRecord) -> list[Emit]:
    """What announces a held job's release (`JobAccepted`) or cancellation."""
    if record.state is JobState.CANCELLED:
        return _cancel_outputs(record)
    return [admission(record)]


def admission(record: JobRecord) -> Emit:
    """The admission, with what split-stride needs to schedule and start the job, in the
    job's trace and under its correlation id (its submission's event id), whatever caused it
    (the submission, or the completion of a job it waited for)."""
    sub = record.submission
    return Emit(record.admission(), correlation_id=sub.event_id, trace_parent=sub.trace_parent)


def _placed_text(data: JobPlaced) -> str:
    text = f"placed on {data.generation} {', '.join(data.servers)} by the scheduler"
    if data.chosen_by is None:
        return text  # a prepared start, or a scheduler older than the field
    return f"{text}: {Pass.describe(data.chosen_by, data.generation)}"


def _admitted(data: JobSubmitted) -> str:
    kind = f", job type {data.job_type!r}" if data.job_type else ""
    return f"accepted: {data.gpus} GPU(s){kind}"


def _handled(record: JobRecord) -> list[Emit]:
    """What a submission's handler publishes once `record` is taken in."""
    _log.info(
        "submission handled",
        user=record.user,
        job_id=record.job_id,
        state=record.state,
        servers=record.servers,
    )
    return _submission_outputs(record)


def _submission_outputs(record: JobRecord) -> list[Emit]:
    if record.state is JobState.REJECTED:
        assert record.rejection_code is not None and record.reason is not None
        return [
            Emit(
                JobRejected(
                    user=record.user,
                    job_id=record.job_id,
                    code=record.rejection_code,
                    reason=record.reason,
                )
            )
        ]
    sub = record.submission
    if record.state is JobState.HELD:
        return [
            Emit(
                JobHeld(
                    user=record.user, job_id=record.job_id, gpus=sub.gpus, waiting_on=sub.after_ok
                )
            )
        ]
    return [admission(record)]


def _cancel_outputs(record: JobRecord) -> list[Emit]:
    assert record.cancelled_from is not None
    outputs: list[Emit] = [
        Emit(
            JobCancelled(
                user=record.user,
                job_id=record.job_id,
                previous_state=record.cancelled_from,
                reason=record.reason,
            ),
            trace_parent=record.submission.trace_parent,
        )
    ]
    for node_id in sorted({*record.servers, *record.nodes}):
        outputs.append(
            Emit(
                KillCommand(
                    node_id=node_id,
                    user=record.user,
                    job_id=record.job_id,
                    attempt=record.attempt,
                    reason=record.reason or "cancelled",
                ),
                trace_parent=record.submission.trace_parent,
            )
        )
    return outputs


def build_service(settings: PlacementSettings | None = None) -> Service:
    settings = settings or PlacementSettings()
    return PlacementService(
        settings, ThroughputEstimator(seed_table(settings.throughputs))
    ).service()
