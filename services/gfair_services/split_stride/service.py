"""The split-stride service: owns time. Every quantum it drives the decision kernel
(`gfair.core.kernel`) and carries its decision out on every server.

Consumers (durable, one worker each):

- ``split-stride-jobs`` (GFAIR_JOBS): admissions, retries, the node executors' reports of what
  started and what let go, and the ends of jobs;
- ``split-stride-nodes`` (GFAIR_NODES): the servers (the cluster is whatever registered);
- ``split-stride-shares`` (GFAIR_SCHED): entitlements published by the trading auction, and the
  speed profiles and each job's switch costs published by the profiler.

A timer every ``quantum_s`` emits `QuantumTicked`, decides the quantum from the ledger's
snapshot, emits `JobPlaced` for every job the kernel placed on other servers than before, then
per server the `SuspendCommand`s of jobs leaving, the `StartCommand`s of jobs entering and its
`ScheduleDecided` (see `quantum`). A newly admitted job that fits idle GPUs starts at once,
between ticks. The clock is injected (`clock`), so tests drive quanta by hand.

A job submitted with `prepare` that fits one server and does not start at once is placed on a
server where it could run (`_prepare_node`: the fastest pool its user is entitled to, the
server there with the fewest jobs parked on it) and gets a `PrepareCommand` there: its process
starts without GPUs and parks (`JobSuspended`, reason `prepared`, in place). From then on it is
held as parked there on no GPUs in particular (`Job.parked` with no indices), so the kernel's
preference for a job's own server and cheap in-place resume brings its first slice there; a
start elsewhere tells that node to let it go (`_release`), as for any job parked in place.

State is the `StrideRecord` in `gfair_stride` (its only writer). Every handler and tick changes
the ledger, publishes its outputs under ids derived from what caused them, and only then writes
the record: a crash before the write replays the cause from the last record and publishes the
same ids again, which JetStream drops as duplicates. Handlers return nothing to the runtime.

Handlers send their outputs without waiting for each to be stored and leave the record to their
batch's settling (`settle`), which waits for everything sent, then writes the record once for
the whole batch, before the runtime acknowledges the inputs. A record holds every job, so
writing it per event would cost in proportion to the cluster for each placement. If sending or
writing fails, the ledger is reloaded from the record and the batch redelivered: it is handled
again from what was stored. The job records a batch of placements needs are read together,
before its handlers run (`prefetch`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

import structlog
from opentelemetry import trace

from gfair.bus.key_value import KeyValue, KvConflict
from gfair.bus.metrics import gfair_metrics
from gfair.bus.publisher import derived_event_id
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.service import Emit, Service
from gfair.bus.topology import consumer_for
from gfair.bus.transport import PubAck
from gfair.core.cluster import generation_rank
from gfair.core.throughput import ThroughputEstimator
from gfair.events.commands import (
    KillCommand,
    NodeCommand,
    PrepareCommand,
    StartCommand,
    SuspendCommand,
)
from gfair.events.envelope import Clock, Envelope, EventData, utc_now
from gfair.events.fields import JobRef
from gfair.events.gang_peers import gang_environment
from gfair.events.job_array import array_environment
from gfair.events.jobs import (
    JobAccepted,
    JobCancelled,
    JobCompleted,
    JobEvent,
    JobExited,
    JobFailed,
    JobMigrated,
    JobPlaced,
    JobResumed,
    JobRetried,
    JobStarted,
    JobSuspended,
)
from gfair.events.nodes import NodeEvent
from gfair.events.reasons import SuspendReason
from gfair.events.scheduling import (
    EntitlementsUpdated,
    ProfileUpdated,
    QuantumTicked,
    ScheduleDecided,
    SwitchCostsUpdated,
)
from gfair.state import buckets
from gfair.state.buckets import job_key
from gfair.state.job_record import StoredJob, Submission, load_job
from gfair.state.stride_record import StrideRecord, load_stride, save_stride
from gfair_services.inventory import INVENTORY_EVENTS, NodeEntry
from gfair_services.profiler.seed import seed_table
from gfair_services.topology import cluster_topology

from .ledger import Job, Ledger
from .quantum import ServerTurn, Start, Starts, Stop, decide_quantum, fill, start_at_once
from .settings import Settings

SERVICE_NAME = "split-stride"

JOB_EVENTS: tuple[type[EventData], ...] = (
    JobAccepted,
    JobRetried,
    JobStarted,
    JobResumed,
    JobSuspended,
    JobMigrated,
    JobExited,
    JobCompleted,
    JobFailed,
    JobCancelled,
)
_TERMINAL = (JobCompleted, JobFailed, JobCancelled)
SHARES_EVENTS: tuple[type[EventData], ...] = (
    EntitlementsUpdated,
    ProfileUpdated,
    SwitchCostsUpdated,
)


_log = structlog.get_logger("gfair.split_stride")
_tracer = trace.get_tracer("gfair.split_stride")


class SplitStrideService:
    def __init__(self, settings: Settings, clock: Clock = utc_now) -> None:
        self.settings = settings
        self.clock = clock
        self._lock = asyncio.Lock()
        self._ledger: Ledger | None = None
        self._revision: int | None = None
        self._runtime: ServiceRuntime | None = None
        self._stride_kv: KeyValue | None = None
        self._jobs_kv: KeyValue | None = None
        # What each job runs (argv, env, working dir), read once from its JobRecord.
        self._submissions: dict[str, Submission] = {}
        # The jobs each node was told to prepare (held by `_prepare_node` to its GPUs).
        self._preparing: dict[str, set[str]] = {}
        # Outputs sent and not yet known to be stored, in the order sent.
        self._sends: list[asyncio.Task[PubAck]] = []
        # The ledger holds changes the record does not.
        self._dirty = False
        # Times the ledger was reloaded from the record, and the count when each route's
        # unsettled batch began: a reload in between lost that batch's changes.
        self._loads = 0
        self._batch_began: dict[str, int] = {}
        # Job records read ahead for the placements of the batch in hand (None: no record).
        self._prefetched: dict[str, StoredJob | None] = {}

    def service(self) -> Service:
        ack_wait_s = self.settings.ack_wait_s
        service = Service(SERVICE_NAME, topology=cluster_topology(replicas=self.settings.replicas))
        service.add_handler(
            self.on_job_event,
            consumer_for(JOB_EVENTS, durable="split-stride-jobs"),
            accepts=JOB_EVENTS,
            name="jobs",
            ack_wait_s=ack_wait_s,
            settle=self._settler("jobs"),
            prepare=self.prefetch,
        )
        service.add_handler(
            self.on_node_event,
            consumer_for(INVENTORY_EVENTS, durable="split-stride-nodes"),
            accepts=INVENTORY_EVENTS,
            name="nodes",
            ack_wait_s=ack_wait_s,
            settle=self._settler("nodes"),
        )
        service.add_handler(
            self.on_shares_event,
            consumer_for(SHARES_EVENTS, durable="split-stride-shares"),
            accepts=SHARES_EVENTS,
            name="shares",
            ack_wait_s=ack_wait_s,
            settle=self._settler("shares"),
        )
        service.add_timer(
            self.settings.quantum_s, self.on_tick, name="quantum", first_in=self._first_tick_in
        )
        service.on_start(self.start)
        return service

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            raise RuntimeError("split-stride has not started")
        return self._ledger

    # -- start ----------------------------------------------------------------------------------

    async def start(self, runtime: ServiceRuntime) -> None:
        self._runtime = runtime
        self._stride_kv = await runtime.key_value(buckets.STRIDE.name)
        self._jobs_kv = await runtime.key_value(buckets.JOBS.name)
        await self._load()
        _log.info(
            "split-stride state loaded",
            quantum=self.ledger.quantum,
            jobs=len(self.ledger.jobs),
            servers=len(self.ledger.inventory),
        )

    async def _load(self) -> None:
        assert self._stride_kv is not None
        stored = await load_stride(self._stride_kv)
        if stored is None:
            record = StrideRecord.fresh(uuid.uuid4().hex, self.clock())
            self._revision = None
        else:
            record, self._revision = stored.record, stored.revision
        # alpha 1: each published profile replaces the last (the profiler already averaged).
        estimator = ThroughputEstimator(seed_table(self.settings.throughputs), alpha=1.0)
        self._ledger = Ledger(record, self.settings, estimator)
        self._loads += 1
        self._dirty = False

    def _first_tick_in(self) -> float:
        """Seconds to the next tick of the grid the last tick set, across a restart too: a
        restarted split-stride decides when the quantum it took over ends (at once when that
        is past), not a whole quantum after it came back."""
        last = self.ledger.last_tick_at
        if last is None:
            return self.settings.quantum_s
        return self.settings.quantum_s - (self.clock() - last).total_seconds()

    # -- handlers -------------------------------------------------------------------------------

    async def on_job_event(self, envelope: Envelope, data: EventData) -> list[Emit]:
        async with self._lock:
            self._batch_began.setdefault("jobs", self._loads)
            if self.ledger.seen(envelope.id) or not isinstance(data, JobEvent):
                return []
            outputs = await self._job_event(envelope, data)
            if outputs is None:
                return []
            self._commit(envelope, outputs, seed=envelope.id)
        return []

    async def _job_event(self, envelope: Envelope, data: JobEvent) -> list[EventData] | None:
        """The events to publish, or None when nothing changed."""
        ledger = self.ledger
        key = job_key(data.user, data.job_id)
        now = self.clock()
        match data:
            case JobAccepted():
                if key in ledger.jobs or not await self._admit(data):
                    return None
                starts = await self._starts_events(start_at_once(ledger, key, now, arrival=True))
                return starts + self._prepare(key)
            case JobSuspended() if data.reason is SuspendReason.PREPARED:
                return self._prepared(data)
            case JobRetried():
                if not ledger.retried(data, envelope.time):
                    return None
                return await self._starts_events(start_at_once(ledger, key, now, arrival=True))
            case JobStarted() | JobResumed():
                return [] if ledger.confirmed(data, envelope.time, now) else None
            case JobSuspended() | JobMigrated() | JobExited():
                if not ledger.released(data, envelope.time, now):
                    return None
                # A job that waited for its old node to let go may start at once where it
                # moved; GPUs still idle go to waiting jobs.
                moved = start_at_once(ledger, key, now, arrival=False)
                filled = fill(ledger, now)
                return await self._starts_events(
                    Starts(moved.turns + filled.turns, moved.placed + filled.placed)
                )
            case JobCompleted() | JobFailed() | JobCancelled():
                job = ledger.finished(data.user, data.job_id)
                if job is None:
                    return None
                self._submissions.pop(key, None)
                state = data.JOB_STATE or "over"
                kills: list[EventData] = [
                    _kill(job, node_id, stay.attempt, f"the job is {state}")
                    for node_id, stay in sorted(job.stays.items())
                    if stay.holds_gpus
                ]
                if job.parked is not None and job.parked[0] not in job.stays:
                    # Its process parked in place there holds no GPU, but lives.
                    kills.append(_kill(job, job.parked[0], job.attempt, f"the job is {state}"))
                # Its GPUs go to waiting jobs now; a node runs the kill before any start.
                return kills + await self._starts_events(fill(ledger, now))
        return None

    def _prepare(self, key: str) -> list[EventData]:
        """A prepared start of a newly admitted job that opted in and did not start at once."""
        ledger = self.ledger
        job, sub = ledger.jobs.get(key), self._submissions.get(key)
        if job is None or sub is None or not sub.prepare or job.stays or job.parked is not None:
            return []
        entry = _prepare_node(ledger, job, self._waiting_prepared)
        if entry is None:
            return []  # fits no server whole, or those are full of waiting processes
        job.servers, job.generation = (entry.node_id,), entry.generation
        self._preparing.setdefault(entry.node_id, set()).add(key)
        prepare = PrepareCommand(
            node_id=entry.node_id,
            user=job.user,
            job_id=job.job_id,
            attempt=job.attempt,
            command=sub.command,
            env={**sub.env, **array_environment(sub.array)},
            working_dir=sub.working_dir,
            gpus=job.gpus,
            generation=entry.generation,
            checkpoint_dir=self.settings.checkpoint_dir(job.user, job.job_id),
        )
        _log.info("prepared start", job=key, node_id=entry.node_id)
        return [_placed(job), prepare]

    def _waiting_prepared(self, node_id: str) -> int:
        """How many jobs prepared on `node_id` wait there, not yet given GPUs (forgetting the
        ones that started, moved or ended)."""
        keys = self._preparing.get(node_id, set())
        for key in list(keys):
            job = self.ledger.jobs.get(key)
            if job is None or job.stays or job.servers != (node_id,):
                keys.discard(key)
        return len(keys)

    def _prepared(self, event: JobSuspended) -> list[EventData] | None:
        """A prepared start parked: held as parked there (on any of its GPUs), unless the job
        started elsewhere meanwhile, was retried or ended: then that node lets it go."""
        job = self.ledger.jobs.get(job_key(event.user, event.job_id))
        node_id = event.node_id
        if job is not None and job.attempt == event.attempt and not job.exited:
            if not job.stays:
                job.parked = (node_id, ())
                return []
            if node_id in job.stays:
                return []  # its start there is on its way: the node resumes it in place
        # Not wanted there (any more): the process exits, it has nothing to save.
        return [
            SuspendCommand(
                node_id=node_id,
                user=event.user,
                job_id=event.job_id,
                attempt=event.attempt,
                reason=SuspendReason.MIGRATION,
                yield_grace_s=None,
            )
        ]

    async def prefetch(self, events: Sequence[tuple[Envelope, EventData]]) -> None:
        """Read at once the records of the jobs the batch admits that split-stride lacks."""
        self._prefetched.clear()
        wanted = sorted(
            {
                job_key(data.user, data.job_id)
                for _, data in events
                if isinstance(data, JobAccepted)
                and job_key(data.user, data.job_id) not in self.ledger.jobs
            }
        )
        found = await asyncio.gather(
            *(load_job(self.jobs_kv, *key.split(".", 1)) for key in wanted),
            return_exceptions=True,
        )
        for key, record in zip(wanted, found, strict=True):
            if not isinstance(record, BaseException):
                self._prefetched[key] = record

    async def _admit(self, event: JobAccepted) -> bool:
        """Take an admitted job in from its record; False for one that ended meanwhile."""
        key = job_key(event.user, event.job_id)
        if key in self._prefetched:
            record = self._prefetched.pop(key)
        else:
            record = await load_job(self.jobs_kv, event.user, event.job_id)
        if record is None:
            # Placement writes the record before it announces the admission: this one was
            # announced by nobody that admits (forged, or replayed after the record went).
            _log.warning("admission of a job with no record; ignored", job=key)
            return False
        if not record.record.live:
            return False  # a late admission of a job that ended meanwhile
        sub = record.record.submission
        self._submissions[record.record.key] = sub
        self.ledger.admit(
            event.user,
            event.job_id,
            sub.gpus,
            sub.weight,
            sub.job_type,
            record.record.attempt,
            array=sub.array.id if sub.array is not None else None,
            array_limit=sub.array.limit if sub.array is not None else None,
        )
        return True

    async def on_node_event(self, envelope: Envelope, data: EventData) -> list[Emit]:
        async with self._lock:
            self._batch_began.setdefault("nodes", self._loads)
            if not isinstance(data, NodeEvent) or self.ledger.seen(envelope.id):
                return []
            if self.ledger.node_event(envelope, data):
                self._commit(envelope, [], seed=envelope.id)
        return []

    async def on_shares_event(self, envelope: Envelope, data: EventData) -> list[Emit]:
        async with self._lock:
            self._batch_began.setdefault("shares", self._loads)
            if isinstance(data, EntitlementsUpdated):
                changed = self.ledger.entitlements_event(data)
            elif isinstance(data, ProfileUpdated):
                changed = self.ledger.profile_event(data)
            elif isinstance(data, SwitchCostsUpdated):
                changed = self.ledger.costs_event(data)
            else:
                changed = False
            if changed:
                self._commit(envelope, [], seed=envelope.id)
        return []

    async def on_tick(self) -> list[Emit]:
        async with self._lock:
            ledger = self.ledger
            now = self.clock()
            with _tracer.start_as_current_span("split_stride.quantum") as span:
                began = time.perf_counter()
                plan = decide_quantum(ledger, now)
                gfair_metrics().record_quantum(time.perf_counter() - began, plan.waiting)
                gfair_metrics().record_shares(_held(ledger), ledger.entitlements)
                span.set_attribute("gfair.quantum", plan.quantum)
                outputs: list[EventData] = [
                    QuantumTicked(
                        quantum=plan.quantum, starts_at=now, length_s=self.settings.quantum_s
                    )
                ]
                outputs += [_placed(job) for job in plan.placed]
                outputs += await self._turns_events(plan.turns, quantum=plan.quantum)
                outputs += [_stop(stop, self.settings.yield_grace) for stop in plan.strays]
                starts = sum(len(t.starts) for t in plan.turns)
                stops = sum(len(t.stops) for t in plan.turns) + len(plan.strays)
                span.set_attribute("gfair.starts", starts)
                span.set_attribute("gfair.stops", stops)
                # Inside the tick's span: its commands join their jobs' traces linked to it.
                self._commit(None, outputs, seed=f"{ledger.epoch}/quantum/{plan.quantum}")
                await self._store()
            if starts or stops:
                _log.info("quantum decided", quantum=plan.quantum, starts=starts, stops=stops)
        return []

    # -- outputs --------------------------------------------------------------------------------

    async def _starts_events(self, starts: Starts) -> list[EventData]:
        placed: list[EventData] = [_placed(job) for job in starts.placed]
        return placed + await self._turns_events(starts.turns)

    async def _turns_events(
        self, turns: Sequence[ServerTurn], *, quantum: int | None = None
    ) -> list[EventData]:
        outputs: list[EventData] = []
        grace = self.settings.yield_grace
        for turn in turns:
            outputs += [_stop(stop, grace) for stop in turn.stops]
            for start in turn.starts:
                if start.release is not None:
                    outputs.append(_release(start))
                command = await self._start_command(start)
                if command is not None:
                    outputs.append(command)
            decided = quantum if quantum is not None else max(self.ledger.quantum - 1, 0)
            outputs.append(
                ScheduleDecided(
                    quantum=decided,
                    server=turn.node_id,
                    running=tuple(_ref(key) for key in turn.running),
                    central=turn.central,
                )
            )
        return outputs

    async def _start_command(self, start: Start) -> StartCommand | None:
        job = start.job
        sub = self._submissions.get(job.key)
        if sub is None:
            stored = await load_job(self.jobs_kv, job.user, job.job_id)
            if stored is None:
                _log.error("no job record; cannot start it", job=job.key)
                job.stays.pop(start.node_id, None)
                return None
            sub = self._submissions[job.key] = stored.record.submission
        with _tracer.start_as_current_span("split_stride.start") as span:
            span.set_attribute("gfair.user", job.user)
            span.set_attribute("gfair.job_id", job.job_id)
            span.set_attribute("gfair.gpus", len(start.gpu_indices))
            span.set_attribute("gfair.server", start.node_id)
            span.set_attribute("gfair.generation", job.generation or "")
            span.set_attribute("gfair.attempt", job.attempt)
        return StartCommand(
            node_id=start.node_id,
            user=job.user,
            job_id=job.job_id,
            attempt=job.attempt,
            command=sub.command,
            env={**sub.env, **array_environment(sub.array), **self._gang_environment(start)},
            working_dir=sub.working_dir,
            gpu_indices=start.gpu_indices,
            checkpoint_dir=self.settings.checkpoint_dir(job.user, job.job_id),
        )

    def _gang_environment(self, start: Start) -> dict[str, str]:
        """For a part of a gang across servers, where the first part listens (gang_peers)."""
        job = start.job
        if len(job.servers) < 2:
            return {}
        first = self.ledger.inventory.get(job.servers[0])
        return gang_environment(
            user=job.user,
            job_id=job.job_id,
            attempt=job.attempt,
            servers=job.servers,
            node_id=start.node_id,
            master_addr=first.hostname if first and first.hostname else job.servers[0],
            local_gpus=len(start.gpu_indices),
        )

    def _commit(self, cause: Envelope | None, outputs: list[EventData], *, seed: str) -> None:
        """Send `outputs` under ids derived from `seed`; the record follows in `_store`."""
        assert self._runtime is not None
        publisher = self._runtime.publisher
        for data in outputs:
            sub = self._submissions.get(_job_key_of(data) or "")
            # A job's commands join its trace; a server's decision links the jobs it runs.
            running = data.running if isinstance(data, ScheduleDecided) else ()
            self._sends.append(
                publisher.send(
                    data,
                    causation=cause,
                    correlation_id=sub.event_id if sub is not None else None,
                    event_id=derived_event_id(seed, 0, data.EVENT_TYPE, _identity(data)),
                    trace_parent=sub.trace_parent if sub is not None else None,
                    links=[self._trace_parent(job_key(r.user, r.job_id)) for r in running],
                )
            )
        if cause is not None:
            self.ledger.note(cause.id)
        self._dirty = True

    async def _store(self) -> None:
        """Wait for everything sent to be stored, then write the record; hold the lock.

        On failure the ledger is reloaded from the record: it must not keep changes whose
        outputs may never have gone out, or that the record does not hold.
        """
        assert self._stride_kv is not None
        sends, self._sends = self._sends, []
        results = await asyncio.gather(*sends, return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            _log.error("publishing failed; reloading the last record", error=repr(failed))
            await self._load()
            raise failed
        if not self._dirty:
            return
        record = self.ledger.to_record(self.clock())
        try:
            self._revision = await save_stride(self._stride_kv, record, self._revision)
        except KvConflict:
            # Another writer (a second split-stride?) moved the record: start again from it.
            _log.error("gfair_stride changed under us; reloading")
            await self._load()
            raise
        except Exception:
            await self._load()
            raise
        self._dirty = False

    def _settler(self, route: str) -> Callable[[], Awaitable[None]]:
        """Settles a batch of `route`: its outputs stored and the record written."""

        async def settle() -> None:
            async with self._lock:
                began = self._batch_began.pop(route, self._loads)
                await self._store()
                if began != self._loads:
                    raise RuntimeError(
                        "the ledger was reloaded while the batch was handled; handling it again"
                    )

        return settle

    def _trace_parent(self, key: str) -> str | None:
        sub = self._submissions.get(key)
        return sub.trace_parent if sub is not None else None

    @property
    def jobs_kv(self) -> KeyValue:
        if self._jobs_kv is None:
            raise RuntimeError("split-stride has not started")
        return self._jobs_kv


def _held(ledger: Ledger) -> dict[str, dict[str, float]]:
    """GPUs each user holds per pool now (its received share)."""
    held: dict[str, dict[str, float]] = {}
    for job in ledger.jobs.values():
        gpus = sum(len(s.gpu_indices) for s in job.stays.values() if s.holds_gpus)
        if gpus and job.generation is not None:
            pools = held.setdefault(job.user, {})
            pools[job.generation] = pools.get(job.generation, 0.0) + gpus
    return held


def _prepare_node(ledger: Ledger, job: Job, waiting: Callable[[str], int]) -> NodeEntry | None:
    """Where a prepared start goes: among the servers that take the whole job and have fewer
    prepared jobs `waiting` than GPUs (a burst of submissions must not start a process per job
    on one server at once), those of the fastest pool its user is entitled to (any pool
    before entitlements are known), the one with the fewest jobs parked on it, then by name;
    None when there is none."""
    fits = [
        e
        for e in ledger.schedulable()
        if e.takes_new_work and e.gpus >= job.gpus and waiting(e.node_id) < e.gpus
    ]
    shares = ledger.entitlements.get(job.user, {})
    entitled = [e for e in fits if shares.get(e.generation, 0.0) > 0] or fits
    if not entitled:
        return None
    fastest = max(generation_rank(e.generation) for e in entitled)
    pool = [e for e in entitled if generation_rank(e.generation) == fastest]
    # One pass over the jobs for every server's count (one admission is not worth a pass each).
    parked = Counter(
        j.parked[0] for j in ledger.jobs.values() if j.parked is not None and not j.stays
    )
    return min(pool, key=lambda e: (parked[e.node_id], e.node_id))


def _placed(job: Job) -> JobPlaced:
    assert job.generation is not None
    return JobPlaced(
        user=job.user, job_id=job.job_id, servers=job.servers, generation=job.generation
    )


def _ref(key: str) -> JobRef:
    user, _, job_id = key.partition(".")
    return JobRef(user=user, job_id=job_id)


def _job_key_of(data: EventData) -> str | None:
    if isinstance(data, NodeCommand | JobEvent):
        return job_key(data.user, data.job_id)
    return None


def _identity(data: EventData) -> str:
    """What makes an output unique within its cause: subject plus the job or server."""
    detail = _job_key_of(data)
    if isinstance(data, ScheduleDecided):
        detail = data.server
    return f"{data.subject()}/{detail or ''}"


def _kill(job: Job, node_id: str, attempt: int, reason: str) -> KillCommand:
    return KillCommand(
        node_id=node_id, user=job.user, job_id=job.job_id, attempt=attempt, reason=reason
    )


def _stop(stop: Stop, grace_s: float) -> EventData:
    if not isinstance(stop.reason, SuspendReason):
        return _kill(stop.job, stop.node_id, stop.attempt, stop.reason)
    return SuspendCommand(
        node_id=stop.node_id,
        user=stop.job.user,
        job_id=stop.job.job_id,
        attempt=stop.attempt,
        reason=stop.reason,
        # Enforced by the node: a job ignoring it cannot hold the GPUs the next job waits for.
        # A drain off a quarantined node waits for nobody: the node's own timeout.
        yield_grace_s=None if stop.reason is SuspendReason.DRAIN else grace_s,
    )


def _release(start: Start) -> SuspendCommand:
    """Tell the node where `start`'s job is parked in place to checkpoint it and let go: it
    starts elsewhere, from that checkpoint (the node starting it waits for it)."""
    job = start.job
    assert start.release is not None
    return SuspendCommand(
        node_id=start.release,
        user=job.user,
        job_id=job.job_id,
        attempt=job.attempt,
        reason=SuspendReason.MIGRATION,
        yield_grace_s=None,
    )


def build_service(settings: Settings | None = None, clock: Clock = utc_now) -> Service:
    return SplitStrideService(settings or Settings(), clock).service()
