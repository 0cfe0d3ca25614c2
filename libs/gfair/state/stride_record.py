"""What split-stride keeps in `gfair_stride` (its only writer): one `StrideRecord`, key ``state``.

One key, written after every change, so passes, GPU assignments and usage are always mutually
consistent when split-stride restarts from it:

- ``users``: each active user's account with the decision kernel (arrival order and credit
  per pool, `gfair.core.accounts`), ``seq`` the next arrival number, and each job's pass and
  arrival order in ``jobs``;
- ``profiles``: the users' speed profiles per job type, as the profiler last published them;
- ``servers``: the servers split-stride schedules (registered nodes: generation, GPU indices,
  whether they are available);
- ``jobs``: every admitted, unfinished job: where the kernel last placed it, whether it may run
  now, what its switches take as the profiler last estimated them (``switches``), and its
  *residency*, the nodes where split-stride told it to run and has not yet heard it let go.
  Residencies that are ``starting`` or ``running`` hold their GPU indices (a GPU is never in two
  of them); ``suspending`` ones hold no GPU on their node (the node executor handles commands in
  order, so a start after the suspend finds the GPUs free) but keep the job from starting on any
  other node until the node confirms it released the job;
- ``usage``: GPU-seconds per user per pool since ``usage_since`` (what `gfair users` shows).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from gfair.events.fields import (
    Attempt,
    Generation,
    GpuCount,
    GpuIndex,
    JobId,
    Name,
    NodeId,
    Seconds,
    UserName,
)
from gfair.events.states import NodeState
from gfair.state.buckets import job_key
from gfair.state.job_record import RecordBucket

STATE_KEY = "state"
MAX_APPLIED_IDS = 256


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ServerRecord(_Record):
    """A registered node as split-stride knows it (folded from the node events)."""

    node_id: NodeId
    generation: Generation
    gpu_indices: tuple[GpuIndex, ...] = Field(min_length=1)
    state: NodeState = NodeState.READY
    changed_at: AwareDatetime
    hostname: str | None = None

    @property
    def gpus(self) -> int:
        return len(self.gpu_indices)


class Phase(StrEnum):
    STARTING = "starting"  # a StartCommand was sent
    RUNNING = "running"  # the node said it started (or resumed)
    SUSPENDING = "suspending"  # a SuspendCommand was sent; the node has not confirmed it yet

    @property
    def holds_gpus(self) -> bool:
        return self is not Phase.SUSPENDING


class Residency(_Record):
    """Where split-stride last told a job to run, until the node lets it go."""

    node_id: NodeId
    phase: Phase
    attempt: Attempt
    gpu_indices: tuple[GpuIndex, ...]
    since: AwareDatetime
    quantum: int = Field(ge=0, description="Quantum of the command that set this phase")
    pending_suspends: int = Field(
        default=0,
        ge=0,
        description="Suspends sent and not yet confirmed; a confirmation of an old suspend "
        "does not end a residency that a later start renewed",
    )
    unconfirmed: bool = Field(
        default=False,
        description="Stopped before the node confirmed the start; a node that refused the "
        "start answers neither, so the stop is forgotten after the short "
        "`unconfirmed_release_s`",
    )


class SwitchMeasurements(_Record):
    """A job's measured switches as the profiler last published them (`SwitchCostsUpdated`):
    what split-stride charges it for a resume and a move (`gfair.core.switch_costs`)."""

    reports: int = Field(ge=1, description="Switch reports they fold in: a later estimate has more")
    yield_s: Seconds | None = None
    resume_in_place_s: Seconds | None = None
    cold_start_s: Seconds | None = None


class StrideJob(_Record):
    user: UserName
    job_id: JobId
    gpus: GpuCount
    weight: float = Field(gt=0, description="Weight among its user's jobs")
    job_type: Name | None = None
    seq: int = Field(default=0, ge=0, description="Arrival order, the kernel's last tie-break")
    stride_pass: float = Field(
        default=0.0, description="GPU-quanta received while contended, over its weight"
    )
    generation: Generation | None = None
    servers: tuple[NodeId, ...] = Field(
        default=(), description="Where the kernel last placed it; empty: never placed"
    )
    attempt: Attempt = 1
    runnable_at: AwareDatetime | None = Field(
        default=None, description="A retried job waits until then"
    )
    exited: bool = Field(
        default=False, description="Its process ended; waiting for the failure detector's verdict"
    )
    residency: tuple[Residency, ...] = ()
    array: JobId | None = Field(default=None, description="Its job array's id, if any")
    array_limit: int | None = Field(
        default=None, ge=1, description="At most this many of its array run at once"
    )
    switches: SwitchMeasurements | None = Field(
        default=None, description="Its measured switch costs; None: the operator's until measured"
    )
    prepare: bool = Field(default=False, description="It opted in to prepared starts")

    @property
    def key(self) -> str:
        return job_key(self.user, self.job_id)

    def resident_on(self, node_id: str) -> Residency | None:
        return next((r for r in self.residency if r.node_id == node_id), None)


class StrideUser(_Record):
    """A user's account with the decision kernel (`gfair.core.kernel.UserState`)."""

    seq: int = Field(ge=0, description="Arrival order of the user")
    credit: dict[Generation, float] = Field(
        default_factory=dict, description="GPU-quanta owed per pool"
    )


class TypeProfile(_Record):
    job_type: Name | None = None
    rates: dict[Generation, float]


class StrideRecord(_Record):
    epoch: str = Field(description="Made when the record is first written; seeds tick event ids")
    quantum: int = Field(default=0, ge=0, description="The next quantum to decide")
    last_tick_at: AwareDatetime | None = None
    seq: int = Field(default=0, ge=0, description="The next arrival number (users and jobs)")
    users: dict[UserName, StrideUser] = Field(default_factory=dict)
    profiles: dict[UserName, dict[str, TypeProfile]] = Field(
        default_factory=dict, description="User -> job type key -> its latest published profile"
    )
    servers: dict[NodeId, ServerRecord] = Field(default_factory=dict)
    jobs: dict[str, StrideJob] = Field(default_factory=dict)
    usage: dict[UserName, dict[Generation, float]] = Field(
        default_factory=dict, description="GPU-seconds per user per pool"
    )
    usage_since: AwareDatetime
    entitlements: dict[UserName, dict[Generation, float]] = Field(default_factory=dict)
    entitlements_revision: int = -1
    applied_event_ids: tuple[str, ...] = ()
    updated_at: AwareDatetime

    def running_on(self, node_id: str) -> dict[str, tuple[int, ...]]:
        """Job key -> GPU indices of the jobs holding GPUs of `node_id`."""
        return {
            job.key: residency.gpu_indices
            for job in self.jobs.values()
            for residency in job.residency
            if residency.node_id == node_id and residency.phase.holds_gpus
        }

    def usage_of(self, user: str) -> float:
        return sum(self.usage.get(user, {}).values())

    def to_bytes(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> StrideRecord:
        return cls.model_validate_json(raw)

    @classmethod
    def fresh(cls, epoch: str, now: datetime) -> StrideRecord:
        return cls(epoch=epoch, usage_since=now, updated_at=now)


class StoredStride(_Record):
    record: StrideRecord
    revision: int


async def load_stride(bucket: RecordBucket) -> StoredStride | None:
    entry = await bucket.get(STATE_KEY)
    if entry is None or not entry.value:
        return None
    return StoredStride(record=StrideRecord.from_bytes(entry.value), revision=entry.revision)


async def save_stride(bucket: RecordBucket, record: StrideRecord, revision: int | None) -> int:
    """Create (`revision` None) or update at `revision`; conflicts propagate (one writer)."""
    if revision is None:
        return await bucket.create(STATE_KEY, record.to_bytes())
    return await bucket.update(STATE_KEY, record.to_bytes(), revision)
