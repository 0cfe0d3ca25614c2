"""What split-stride keeps in `gfair_stride` (its only writer): a `StrideRecord`, stored in parts.

Key ``state`` holds what is cluster-wide (the quantum, the users' accounts, profiles, usage,
entitlements, the ids of the events applied); each job is under ``job.<user>.<job id>`` and
each server under ``server.<node id>``, so a write costs what changed, not the cluster (one key
holding every job, ~520 bytes each, outgrew NATS's 1 MiB message at ~2,000 jobs). A batch of
changes is made atomic by a redo log: the changed parts go first to ``log.<n>`` (chunks of at
most `LOG_CHUNK_BYTES`, tagged with the batch's `commit`), then ``state`` names that commit
(the commit point), then the parts are written to their own keys. A reader that finds the log
of the state's commit applies it over the parts, so passes, GPU assignments and usage are
always mutually consistent when split-stride restarts from it, however far the last write got.
A record of the old layout (every job and server inside ``state``, `layout` 1) is read as it is
and stored in parts at its next write.

What the record holds:

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

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from pydantic import AwareDatetime, BaseModel, Field, model_validator

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
from gfair.events.jobs import JobLaunch
from gfair.events.states import NodeState
from gfair.state.buckets import STRIDE, job_key, read_record
from gfair.state.job_record import RecordBucket, StoredValue
from gfair.state.record import Record

STATE_KEY = "state"
JOB_PREFIX = "job."
SERVER_PREFIX = "server."
LOG_PREFIX = "log."
MAX_APPLIED_IDS = 256
# A log chunk stays well inside the broker's message limit (nats-server's default 1 MiB).
LOG_CHUNK_BYTES = 256 * 1024
# Parts written or read at once: enough to fill the round trips, few enough to hold memory.
PARALLEL_PARTS = 256
PARTS_LAYOUT = 2


class ServerRecord(Record):
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


class ResidencyPhase(StrEnum):
    STARTING = "starting"  # a StartCommand was sent
    RUNNING = "running"  # the node said it started (or resumed)
    SUSPENDING = "suspending"  # a SuspendCommand was sent; the node has not confirmed it yet

    @property
    def holds_gpus(self) -> bool:
        return self is not ResidencyPhase.SUSPENDING


class Residency(Record):
    """Where split-stride last told a job to run, until the node lets it go."""

    node_id: NodeId
    phase: ResidencyPhase
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


class SwitchMeasurements(Record):
    """A job's measured switches as the profiler last published them (`SwitchCostsUpdated`):
    what split-stride charges it for a resume and a move (`gfair.core.switch_costs`)."""

    reports: int = Field(ge=1, description="Switch reports they fold in: a later estimate has more")
    yield_s: Seconds | None = None
    resume_in_place_s: Seconds | None = None
    cold_start_s: Seconds | None = None


class ParkedPlace(Record):
    """Where a job's process waits parked in place, holding no GPU: its node, and the GPUs it
    resumes on (none in particular for a prepared start)."""

    node_id: NodeId
    gpu_indices: tuple[GpuIndex, ...] = ()


class StrideJob(Record):
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
    ran_s: Seconds = Field(
        default=0.0, description="Running time (holding GPUs) of its runs ended so far"
    )
    parked: ParkedPlace | None = Field(default=None, description="Where its process waits parked")
    coming_up_until: AwareDatetime | None = Field(
        default=None, description="It gets no GPUs until its prepared start parks, or until then"
    )
    prepared_unproven: bool = Field(
        default=False,
        description="Prepared again after a slice ended while it came up, and not seen to come "
        "up since (it is not prepared again until it is)",
    )
    launch: JobLaunch | None = Field(
        default=None,
        description="What its starts need (`JobAccepted.launch`, its job array's variables "
        "added); absent from jobs admitted before admissions carried it (split-stride then "
        "reads it once from the job's record as it loads this one)",
    )
    correlation_id: str | None = Field(
        default=None, max_length=128, description="The job's: its commands join its life"
    )
    trace_parent: str | None = Field(
        default=None, max_length=128, description="W3C traceparent of the job's trace"
    )

    @model_validator(mode="before")
    @classmethod
    def _ids_beside_launch(cls, data: Any) -> Any:
        """Records until 2026-12 kept the job's two ids inside its launch."""
        launch = data.get("launch") if isinstance(data, dict) else None
        if isinstance(launch, dict) and "correlation_id" not in data:
            ids = {k: launch.get(k) for k in ("correlation_id", "trace_parent")}
            return {**data, **ids}
        return data

    @property
    def key(self) -> str:
        return job_key(self.user, self.job_id)

    def resident_on(self, node_id: str) -> Residency | None:
        return next((r for r in self.residency if r.node_id == node_id), None)


class StrideUser(Record):
    """A user's account with the decision kernel (`gfair.core.kernel.UserState`)."""

    seq: int = Field(ge=0, description="Arrival order of the user")
    credit: dict[Generation, float] = Field(
        default_factory=dict, description="GPU-quanta owed per pool"
    )


class TypeProfile(Record):
    job_type: Name | None = None
    rates: dict[Generation, float]


class StrideRecord(Record):
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
    layout: int = Field(
        default=1,
        ge=1,
        le=PARTS_LAYOUT,
        description="1: every job and server inside this key; 2: each under its own key",
    )
    commit: int = Field(default=0, ge=0, description="The batch of writes this state ends")
    log_chunks: int = Field(default=0, ge=0, description="Chunks of that batch's redo log")

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


class StoredStride(Record):
    record: StrideRecord
    revision: int


class KeyedValue(StoredValue, Protocol):
    @property
    def key(self) -> str: ...


class StrideBucket(RecordBucket, Protocol):
    """The part of a key-value bucket the stride record uses (`gfair.bus.KeyValue` is one)."""

    async def entries(self) -> Sequence[KeyedValue]: ...

    async def put(self, key: str, value: bytes) -> int: ...

    async def delete(self, key: str, *, revision: int | None = None) -> None: ...


def _job_part(key: str) -> str:
    return f"{JOB_PREFIX}{key}"


def _server_part(node_id: str) -> str:
    return f"{SERVER_PREFIX}{node_id}"


async def load_stride(bucket: StrideBucket, *, parts: bool = True) -> StoredStride | None:
    """The record; without `parts`, its cluster-wide part only (no jobs or servers read).
    `UnreadableRecord` if any value it is made of is not what its key holds."""
    entry = await bucket.get(STATE_KEY)
    if entry is None or not entry.value:
        return None
    state = read_record(StrideRecord, STRIDE.name, STATE_KEY, entry.value, entry.revision)
    if state.layout < PARTS_LAYOUT or not parts:
        return StoredStride(record=state, revision=entry.revision)
    # One read of the bucket, the latest value of every key as of one point of its history: the
    # state, the parts, and the log of the state's commit, consistent with each other however
    # far a write under way has got.
    found = {part.key: part for part in await bucket.entries()}
    latest = found.get(STATE_KEY, entry)
    state = read_record(StrideRecord, STRIDE.name, STATE_KEY, latest.value, latest.revision)
    stored = {key: part.value for key, part in found.items()}
    values: dict[str, bytes | dict[str, object] | None] = {
        key: value for key, value in stored.items() if key.startswith((JOB_PREFIX, SERVER_PREFIX))
    }
    for n in range(state.log_chunks):
        key = f"{LOG_PREFIX}{n}"
        chunk = stored.get(key)
        log = read_record(_Log, STRIDE.name, key, chunk) if chunk is not None else None
        # One of a later commit is of a batch that never committed; its parts were not written.
        if log is not None and log.commit == state.commit:
            values.update(log.parts)
    jobs: dict[str, StrideJob] = {}
    servers: dict[str, ServerRecord] = {}
    for key, value in sorted(values.items()):
        if value is None:
            continue
        if key.startswith(JOB_PREFIX):
            job = read_record(StrideJob, STRIDE.name, key, value)
            jobs[job.key] = job
        else:
            server = read_record(ServerRecord, STRIDE.name, key, value)
            servers[server.node_id] = server
    record = state.model_copy(update={"jobs": jobs, "servers": servers})
    return StoredStride(record=record, revision=latest.revision)


async def save_stride(
    bucket: StrideBucket,
    record: StrideRecord,
    revision: int | None,
    written: StrideRecord | None,
    *,
    changed_jobs: Collection[str] | None = None,
) -> StoredStride:
    """Create (`revision` None) or update at `revision`; conflicts propagate (one writer).

    `written` is the record as last stored (None: nothing is): only the jobs and servers that
    differ from it are written, and those it has that `record` lacks are deleted. With
    `changed_jobs`, the writer vouches that no other job differs from `written`: only these are
    looked at (a batch costs what it changed, not a look at every job).
    """
    parts = written is not None and written.layout == PARTS_LAYOUT
    old_jobs = written.jobs if written is not None and parts else {}
    old_servers = written.servers if written is not None and parts else {}
    changed: dict[str, bytes | None] = {
        **_changed(record.jobs, old_jobs, _job_part, among=changed_jobs if parts else None),
        **_changed(record.servers, old_servers, _server_part),
    }
    commit = (written.commit if written is not None else 0) + 1
    chunks = _chunks(commit, changed)
    await _each(
        [(f"{LOG_PREFIX}{n}", chunk) for n, chunk in enumerate(chunks)],
        lambda item: bucket.put(*item),
    )
    state = record.model_copy(
        update={
            "jobs": {},
            "servers": {},
            "layout": PARTS_LAYOUT,
            "commit": commit,
            "log_chunks": len(chunks),
        }
    )
    if revision is None:
        revision = await bucket.create(STATE_KEY, state.to_bytes())
    else:
        revision = await bucket.update(STATE_KEY, state.to_bytes(), revision)
    # The chunks of an earlier, longer log that this one did not overwrite are no longer read.
    stale = range(len(chunks), written.log_chunks if written is not None else 0)
    gone: dict[str, bytes | None] = {f"{LOG_PREFIX}{n}": None for n in stale}
    await _each(list({**changed, **gone}.items()), lambda item: _write_part(bucket, *item))
    stored = record.model_copy(
        update={"layout": PARTS_LAYOUT, "commit": commit, "log_chunks": len(chunks)}
    )
    return StoredStride(record=stored, revision=revision)


class _Log(Record):
    """One chunk of a batch's redo log: each changed part's new value, None if deleted."""

    commit: int
    parts: dict[str, dict[str, object] | None]


P = TypeVar("P", bound=BaseModel)
T = TypeVar("T")
R = TypeVar("R")


def _changed(
    new: Mapping[str, P],
    old: Mapping[str, P],
    key_of: Callable[[str], str],
    among: Collection[str] | None = None,
) -> dict[str, bytes | None]:
    """The parts of `new` that differ from `old`'s (None: deleted); with `among`, only those
    keys are looked at (the caller vouches that no other differs)."""
    found: dict[str, bytes | None] = {}
    if new is old:  # the writer passes the very parts it wrote when none changed
        return found
    keys = among if among is not None else itertools.chain(new, old.keys() - new.keys())
    for k in keys:
        part, was = new.get(k), old.get(k)
        if part is None:
            if was is not None:
                found[key_of(k)] = None
        # The writer reuses the model of a part that did not change: most are the very same
        # object.
        elif was is not part and was != part:
            found[key_of(k)] = part.model_dump_json().encode()
    return found


def _chunks(commit: int, changed: Mapping[str, bytes | None]) -> list[bytes]:
    """The redo log of `changed`, in chunks of at most about `LOG_CHUNK_BYTES`."""
    head = b'{"commit":%d,"parts":{' % commit
    chunks: list[bytes] = []
    items: list[bytes] = []
    size = 0
    for key, value in changed.items():
        item = json.dumps(key).encode() + b":" + (b"null" if value is None else value)
        if items and size + len(item) > LOG_CHUNK_BYTES:
            chunks.append(head + b",".join(items) + b"}}")
            items, size = [], 0
        items.append(item)
        size += len(item) + 1
    if items or not chunks:
        chunks.append(head + b",".join(items) + b"}}")
    return chunks


async def _write_part(bucket: StrideBucket, key: str, value: bytes | None) -> None:
    if value is None:
        await bucket.delete(key)
    else:
        await bucket.put(key, value)


async def _each(items: Iterable[T], call: Callable[[T], Awaitable[R]]) -> list[R]:
    """`call` on every item, `PARALLEL_PARTS` at a time; results in order.

    A failure is raised once every call under way has ended: no write of this batch may land
    after the next batch's write of the same key.
    """
    pending = list(items)
    results: list[R] = []
    for start in range(0, len(pending), PARALLEL_PARTS):
        done = await asyncio.gather(
            *(call(item) for item in pending[start : start + PARALLEL_PARTS]),
            return_exceptions=True,
        )
        for result in done:
            if isinstance(result, BaseException):
                raise result
            results.append(result)
    return results
