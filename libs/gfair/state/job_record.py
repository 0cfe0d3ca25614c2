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
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from gfair.events.envelope import Envelope
from gfair.events.fields import (
    AbsolutePath,
    Argv,
    Attempt,
    Environment,
    Generation,
    GpuCount,
    JobId,
    Name,
    NodeId,
    Step,
    Tickets,
    UserName,
)
from gfair.events.jobs import (
    JobCheckpointed,
    JobEvent,
    JobFailed,
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
from gfair.state.buckets import job_key

# Decisions kept per record (oldest dropped first): enough to explain a job's recent life.
MAX_DECISIONS = 64
# Event ids remembered per record for idempotent folding; redeliveries come soon after.
MAX_APPLIED_IDS = 32


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Submission(_Record):
    """The job as its user submitted it (`JobSubmitted`), and the envelope that carried it."""

    event_id: str = Field(description="Envelope id of the JobSubmitted; a redelivery repeats it")
    submitted_at: AwareDatetime
    trace_parent: str | None = Field(
        default=None,
        description="W3C traceparent of the job's trace (placement's handling of the "
        "submission); events about the job that no job event caused join that trace",
    )
    gpus: GpuCount
    command: Argv
    tickets: Tickets | None = None
    job_type: Name | None = None
    name: Name | None = None
    env: Environment = Field(default_factory=dict)
    working_dir: AbsolutePath | None = None
    max_retries: int | None = None

    @classmethod
    def of(
        cls, envelope: Envelope, data: JobSubmitted, trace_parent: str | None = None
    ) -> Submission:
        return cls(
            event_id=envelope.id,
            submitted_at=envelope.time,
            trace_parent=trace_parent,
            gpus=data.gpus,
            command=data.command,
            tickets=data.tickets,
            job_type=data.job_type,
            name=data.name,
            env=data.env,
            working_dir=data.working_dir,
            max_retries=data.max_retries,
        )

    @property
    def weight(self) -> float:
        """Weight among the user's jobs: equal unless the user says (docs/design.md §1.1)."""
        return self.tickets if self.tickets is not None else 1.0


class Decision(_Record):
    """One thing the scheduler decided about the job, and why (a line of `gfair why`)."""

    at: AwareDatetime
    kind: str = Field(description="admission, placement, pending, migration, lifecycle, ...")
    text: str
    rule: str | None = Field(default=None, description="The placement rule that decided")


class JobRecord(_Record):
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
    decisions: tuple[Decision, ...] = ()
    applied_event_ids: tuple[str, ...] = Field(
        default=(), description="Recently folded event ids (idempotency)"
    )

    @property
    def key(self) -> str:
        return job_key(self.user, self.job_id)

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
        decisions = (*self.decisions, Decision(at=at, kind=kind, text=text, rule=rule))
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
        )

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
        if event.JOB_STATE is not None and event.JOB_STATE is not JobState.SUBMITTED:
            update["state"] = event.JOB_STATE
        match event:
            case JobStarted() | JobResumed():
                update["nodes"] = tuple(sorted({*self.nodes, event.node_id}))
                update["attempt"] = max(self.attempt, event.attempt)
                if isinstance(event, JobResumed) and event.checkpoint_step is not None:
                    update["last_checkpoint_step"] = event.checkpoint_step
            case JobSuspended():
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
        return self.model_copy(update=update)

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> JobRecord:
        return cls.model_validate_json(raw)


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


class StoredJob(_Record):
    record: JobRecord
    revision: int


async def load_job(bucket: RecordBucket, user: str, job_id: str) -> StoredJob | None:
    entry = await bucket.get(job_key(user, job_id))
    if entry is None or not entry.value:
        return None
    return StoredJob(record=JobRecord.from_bytes(entry.value), revision=entry.revision)


async def load_jobs(bucket: RecordBucket, *, user: str | None = None) -> list[StoredJob]:
    """Every job's record (or `user`'s), in key order."""
    prefix = f"{user}." if user is not None else ""
    found: list[StoredJob] = []
    for key in await bucket.keys():
        if not key.startswith(prefix):
            continue
        entry = await bucket.get(key)
        if entry is not None and entry.value:
            found.append(
                StoredJob(record=JobRecord.from_bytes(entry.value), revision=entry.revision)
            )
    return found


async def save_job(bucket: RecordBucket, record: JobRecord, revision: int | None) -> int:
    """Write `record`: create it (`revision` None) or update it at `revision`.

    Returns the new revision; the bucket's conflict error (`gfair.bus.KvConflict`) propagates
    when the key exists (create) or moved on (update).
    """
    if revision is None:
        return await bucket.create(record.key, record.to_bytes())
    return await bucket.update(record.key, record.to_bytes(), revision)
