"""Split-stride's state: the servers, the placed jobs and where they run, passes and usage.

The `Ledger` folds the events split-stride consumes and keeps the core `SplitStride` in step:
a job is *queued* in it exactly while it may run (`runnable`), so the stride never hands a
quantum to a job that cannot use it. A job may run when:

- it is placed on servers that are all registered and schedulable (ready, or merely suspected);
- its process has not exited awaiting the failure detector's verdict, and a retry's delay is over;
- it holds no residency on a node outside its placement: a job moved elsewhere starts there only
  once its old node confirmed it let go (checkpoint written), so it never runs twice.

Leaving the queue keeps the job's lag (pass above the queue minimum), rejoining restores it.
The ledger converts to and from the `StrideRecord` kept in `gfair_stride`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import structlog

from gfair.core.cluster import Cluster
from gfair.core.split_stride import SplitStride
from gfair.events.envelope import Envelope
from gfair.events.jobs import (
    JobExited,
    JobMigrated,
    JobResumed,
    JobRetried,
    JobStarted,
    JobSuspended,
)
from gfair.events.nodes import NodeEvent
from gfair.events.scheduling import EntitlementsUpdated
from gfair.events.states import NodeState
from gfair.state.buckets import job_key
from gfair.state.stride_record import (
    MAX_APPLIED_IDS,
    Phase,
    Residency,
    ServerRecord,
    StrideJob,
    StrideRecord,
)
from gfair_services.inventory import NodeEntry, NodeInventory
from gfair_services.shares import ActiveJob, job_tickets, user_shares

from .settings import Settings

_log = structlog.get_logger("gfair.split_stride")
_TICKET_EPS = 1e-12


@dataclass
class Stay:
    """A residency (see `gfair.state.stride_record`): where the job was told to run."""

    node_id: str
    phase: Phase
    attempt: int
    gpu_indices: tuple[int, ...]
    since: datetime
    quantum: int
    pending_suspends: int = 0
    # Stopped while its start was still unconfirmed. The node processes commands in order, so
    # if it ran the start, `started` comes before any answer to the stop; if it refused the
    # start (its start guard saw the job re-placed meanwhile) nothing comes at all, not even
    # for the stop. Such a stop is forgotten after `unconfirmed_release_s`, not the long
    # `release_timeout_s`. Kept in memory only: after a restart the long timeout applies.
    unconfirmed: bool = False

    @property
    def holds_gpus(self) -> bool:
        return self.phase.holds_gpus


@dataclass
class Job:
    user: str
    job_id: str
    gpus: int
    weight: float
    generation: str | None
    servers: tuple[str, ...]
    attempt: int = 1
    runnable_at: datetime | None = None
    exited: bool = False
    lag: float = 0.0
    tickets: float | None = None
    stays: dict[str, Stay] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return job_key(self.user, self.job_id)

    def signature(self) -> tuple[object, ...]:
        """Everything persisted about the job, to tell whether it changed."""
        return (
            self.servers,
            self.generation,
            self.attempt,
            self.runnable_at,
            self.exited,
            self.lag,
            self.tickets,
            tuple(
                (
                    s.node_id,
                    s.phase,
                    s.attempt,
                    s.gpu_indices,
                    s.since,
                    s.quantum,
                    s.pending_suspends,
                )
                for s in self.stays.values()
            ),
        )

    def gpus_on(self, server_id: str, sizes: dict[str, int]) -> int:
        """GPUs the gang uses on `server_id`: spread as evenly as the servers allow."""
        if len(self.servers) == 1:
            return self.gpus
        left = self.gpus
        order = sorted(self.servers, key=lambda s: (sizes.get(s, 0), self.servers.index(s)))
        for position, server in enumerate(order):
            share = min(sizes.get(server, 0), -(-left // (len(order) - position)))
            if server == server_id:
                return share
            left -= share
        return 0


class Ledger:
    def __init__(self, record: StrideRecord, settings: Settings) -> None:
        self.settings = settings
        self.epoch = record.epoch
        self.quantum = record.quantum
        self.last_tick_at = record.last_tick_at
        self.usage: dict[str, dict[str, float]] = {u: dict(p) for u, p in record.usage.items()}
        self.usage_since = record.usage_since
        self.entitlements: dict[str, dict[str, float]] = {
            u: dict(p) for u, p in record.entitlements.items()
        }
        self.entitlements_revision = record.entitlements_revision
        self.inventory = NodeInventory(
            NodeEntry(s.node_id, s.generation, s.gpu_indices, s.state, s.changed_at)
            for s in record.servers.values()
        )
        self.jobs: dict[str, Job] = {key: _job(j) for key, j in record.jobs.items()}
        self._applied: deque[str] = deque(record.applied_event_ids, maxlen=MAX_APPLIED_IDS)
        self._records: dict[str, tuple[tuple[object, ...], StrideJob]] = {}
        self.stride = self._new_stride(record.split_stride)

    # -- persistence ----------------------------------------------------------------------

    def to_record(self, now: datetime) -> StrideRecord:
        return StrideRecord(
            epoch=self.epoch,
            quantum=self.quantum,
            last_tick_at=self.last_tick_at,
            split_stride=self.stride.snapshot(),
            servers={
                e.node_id: ServerRecord(
                    node_id=e.node_id,
                    generation=e.generation,
                    gpu_indices=e.gpu_indices,
                    state=e.state,
                    changed_at=e.changed_at,
                )
                for e in self.inventory.nodes.values()
            },
            jobs={key: self._job_record(key, job) for key, job in self.jobs.items()},
            usage=self.usage,
            usage_since=self.usage_since,
            entitlements=self.entitlements,
            entitlements_revision=self.entitlements_revision,
            applied_event_ids=tuple(self._applied),
            updated_at=now,
        )

    def _job_record(self, key: str, job: Job) -> StrideJob:
        # Most jobs did not change since the last write; building their records again would
        # make every write cost as much as the whole cluster.
        signature = job.signature()
        cached = self._records.get(key)
        if cached is not None and cached[0] == signature:
            return cached[1]
        record = _record(job)
        self._records[key] = (signature, record)
        return record

    def seen(self, event_id: str) -> bool:
        return event_id in self._applied

    def note(self, event_id: str) -> None:
        self._applied.append(event_id)

    # -- the stride over the schedulable servers ---------------------------------------------

    def schedulable(self) -> list[NodeEntry]:
        return sorted(self.inventory.schedulable(), key=lambda e: e.node_id)

    def _new_stride(self, snapshot: dict[str, object] | None) -> SplitStride:
        stride = SplitStride(Cluster.of(e.server() for e in self.schedulable()))
        if snapshot:
            try:
                stride.restore(snapshot)
            except (ValueError, KeyError, TypeError) as error:
                # Queues rejoin from the jobs' lags at the next sync; only passes are lost.
                _log.warning(
                    "stride snapshot does not fit the servers; starting over", error=str(error)
                )
                stride = SplitStride(stride.cluster)
        return stride

    def _rebuild_stride(self) -> None:
        """Follow a change of the schedulable servers: jobs on servers that went away leave."""
        keep = {e.node_id: e.gpus for e in self.schedulable()}
        for key, servers in list(self.stride.placements().items()):
            if any(keep.get(s) != self.stride.cluster.server(s).gpus for s in servers):
                self._dequeue(key)
        self.stride = self._new_stride(self.stride.snapshot())

    def queued(self, key: str) -> bool:
        return key in self.stride

    def _dequeue(self, key: str) -> None:
        if key in self.stride:
            lag = self.stride.remove(key)
            job = self.jobs.get(key)
            if job is not None:
                job.lag = lag

    def runnable(self, job: Job, now: datetime) -> bool:
        if not job.servers or job.exited:
            return False
        if job.runnable_at is not None and job.runnable_at > now:
            return False
        for server_id in job.servers:
            entry = self.inventory.get(server_id)
            if entry is None or not entry.schedulable:
                return False
        return all(node in job.servers for node in job.stays)

    def sync(self, now: datetime) -> None:
        """Queue exactly the runnable jobs (at the right place), then give them their tickets."""
        for key in self.jobs:
            self.sync_job(key, now)
        self._retick()

    def sync_job(self, key: str, now: datetime) -> None:
        """Queue or dequeue one job; its tickets are settled at the next `sync`."""
        job = self.jobs[key]
        should = self.runnable(job, now)
        if key in self.stride and (not should or self.stride.placement(key) != job.servers):
            self._dequeue(key)
        if should and key not in self.stride:
            try:
                self.stride.add(key, job.servers, job.gpus, job.tickets or 1.0, job.lag)
            except ValueError as error:
                _log.warning("job cannot be queued", job=key, error=str(error))

    def _retick(self) -> None:
        queued = [self.jobs[key] for key in self.stride.placements()]
        pool_gpus: dict[str, float] = {}
        for entry in self.schedulable():
            pool_gpus[entry.generation] = pool_gpus.get(entry.generation, 0) + entry.gpus
        demand: dict[str, float] = {}
        for job in queued:
            demand[job.user] = demand.get(job.user, 0) + job.gpus
        shares = user_shares(
            pool_gpus,
            self.settings.tickets_map(demand),
            demand,
            self.entitlements if self.entitlements_revision >= 0 else None,
        )
        tickets = job_tickets(
            shares,
            (ActiveJob(j.key, j.user, j.generation or "", j.weight) for j in queued),
            self.settings.surplus_weight,
        )
        for job in queued:
            value = tickets[job.key]
            if value > 0 and abs(self.stride.tickets(job.key) - value) > _TICKET_EPS:
                self.stride.set_tickets(job.key, value)
            job.tickets = value

    # -- GPUs held ----------------------------------------------------------------------------

    def holders(self, node_id: str) -> dict[str, Stay]:
        """Job key -> its residency on `node_id`, for jobs holding GPUs there."""
        return {
            job.key: stay
            for job in self.jobs.values()
            if (stay := job.stays.get(node_id)) is not None and stay.holds_gpus
        }

    def free_indices(self, node_id: str) -> list[int]:
        entry = self.inventory.get(node_id)
        if entry is None:
            return []
        held = {i for stay in self.holders(node_id).values() for i in stay.gpu_indices}
        return [i for i in entry.gpu_indices if i not in held]

    def sizes(self) -> dict[str, int]:
        return {node_id: e.gpus for node_id, e in self.inventory.nodes.items()}

    # -- folding events -----------------------------------------------------------------------

    def node_event(self, envelope: Envelope, event: NodeEvent) -> bool:
        before = {(e.node_id, e.gpus) for e in self.schedulable()}
        change = self.inventory.apply(envelope, event)
        if change is None:
            return False
        if change.after is NodeState.FAILED:
            for job in self.jobs.values():
                job.stays.pop(change.node_id, None)  # its processes died with it
        if {(e.node_id, e.gpus) for e in self.schedulable()} != before:
            self._rebuild_stride()
        return True

    def entitlements_event(self, event: EntitlementsUpdated) -> bool:
        if event.revision <= self.entitlements_revision:
            return False
        self.entitlements_revision = event.revision
        self.entitlements = {u: dict(p) for u, p in event.entitlements.items()}
        return True

    def placed(
        self,
        key: str,
        servers: tuple[str, ...],
        generation: str,
        new_job: Job | None = None,
    ) -> bool:
        job = self.jobs.get(key)
        if job is None:
            if new_job is None:
                return False
            self.jobs[key] = new_job
            return True
        if job.servers == servers and job.generation == generation:
            return False
        job.servers, job.generation = servers, generation
        return True

    def confirmed(self, event: JobStarted | JobResumed, at: datetime) -> bool:
        job = self.jobs.get(job_key(event.user, event.job_id))
        if job is None:
            return False
        node = self.inventory.get(event.node_id)
        if node is not None and node.state is NodeState.FAILED:
            return False  # reported before the node was declared dead; it died with it
        stay = job.stays.get(event.node_id)
        if stay is None:
            # A start split-stride does not remember asking for: track what really runs.
            job.stays[event.node_id] = Stay(
                event.node_id, Phase.RUNNING, event.attempt, event.gpu_indices, at, self.quantum
            )
            return True
        if stay.phase is Phase.STARTING and stay.attempt == event.attempt:
            stay.phase = Phase.RUNNING
            return True
        if stay.attempt == event.attempt:
            stay.unconfirmed = False  # it did start: its stop will be confirmed in turn
        return False

    def released(self, event: JobSuspended | JobMigrated | JobExited) -> bool:
        """The node stopped the job: a suspend, a migration away, or the process ended."""
        job = self.jobs.get(job_key(event.user, event.job_id))
        if job is None:
            return False
        node_id = event.from_node if isinstance(event, JobMigrated) else event.node_id
        changed = False
        if isinstance(event, JobExited) and event.attempt >= job.attempt:
            job.exited = True  # until the failure detector says what becomes of it
            changed = True
        stay = job.stays.get(node_id)
        if stay is None:
            return changed
        if isinstance(event, JobSuspended) and stay.pending_suspends > 0:
            stay.pending_suspends -= 1
            if stay.holds_gpus:
                return True  # an older suspend; the start sent after it is still in force
        del job.stays[node_id]
        return True

    def retried(self, event: JobRetried, at: datetime) -> bool:
        job = self.jobs.get(job_key(event.user, event.job_id))
        if job is None or event.attempt < job.attempt:
            return False
        job.attempt = event.attempt
        job.exited = False
        job.runnable_at = at + timedelta(seconds=event.delay_s) if event.delay_s > 0 else None
        return True

    def finished(self, user: str, job_id: str) -> Job | None:
        """Forget a job that ended for good; returns it (its residencies) or None."""
        key = job_key(user, job_id)
        job = self.jobs.pop(key, None)
        if job is not None and key in self.stride:
            self.stride.remove(key)
        return job

    # -- usage --------------------------------------------------------------------------------

    def account(self, now: datetime) -> None:
        """Charge the GPUs held since the last tick to their users, per pool."""
        if self.last_tick_at is not None:
            elapsed = (now - self.last_tick_at).total_seconds()
            elapsed = max(0.0, min(elapsed, self.settings.usage_gap_s))
            for job in self.jobs.values():
                for stay in job.stays.values():
                    if not stay.holds_gpus:
                        continue
                    entry = self.inventory.get(stay.node_id)
                    pool = entry.generation if entry is not None else job.generation or "unknown"
                    per_pool = self.usage.setdefault(job.user, {})
                    per_pool[pool] = per_pool.get(pool, 0.0) + len(stay.gpu_indices) * elapsed
        self.last_tick_at = now

    def expire(self, now: datetime) -> list[tuple[str, Stay]]:
        """Drop starts and suspends no node confirmed in time; what was dropped."""
        limit = timedelta(seconds=self.settings.release_timeout_s)
        refused = timedelta(seconds=self.settings.unconfirmed_release_s)
        dropped: list[tuple[str, Stay]] = []
        for job in self.jobs.values():
            for node_id, stay in list(job.stays.items()):
                if stay.phase is Phase.RUNNING:
                    continue
                wait = refused if stay.unconfirmed else limit
                if now - stay.since > wait:
                    del job.stays[node_id]
                    dropped.append((job.key, stay))
        return dropped


def _job(record: StrideJob) -> Job:
    return Job(
        user=record.user,
        job_id=record.job_id,
        gpus=record.gpus,
        weight=record.weight,
        generation=record.generation,
        servers=record.servers,
        attempt=record.attempt,
        runnable_at=record.runnable_at,
        exited=record.exited,
        lag=record.lag,
        tickets=record.tickets,
        stays={
            r.node_id: Stay(
                r.node_id, r.phase, r.attempt, r.gpu_indices, r.since, r.quantum, r.pending_suspends
            )
            for r in record.residency
        },
    )


def _record(job: Job) -> StrideJob:
    return StrideJob(
        user=job.user,
        job_id=job.job_id,
        gpus=job.gpus,
        weight=job.weight,
        generation=job.generation,
        servers=job.servers,
        attempt=job.attempt,
        runnable_at=job.runnable_at,
        exited=job.exited,
        lag=job.lag,
        tickets=job.tickets,
        residency=tuple(
            Residency(
                node_id=s.node_id,
                phase=s.phase,
                attempt=s.attempt,
                gpu_indices=s.gpu_indices,
                since=s.since,
                quantum=s.quantum,
                pending_suspends=s.pending_suspends,
            )
            for s in job.stays.values()
        ),
    )
