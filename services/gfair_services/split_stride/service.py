"""The split-stride service: owns time, and carries out what the split-stride state machine
(`gfair.core.scheduler`) decides. It decides nothing itself: it turns the events it consumes
into the machine's inputs, and the machine's plans into commands.

Consumers (durable, one worker each):

- ``split-stride-jobs`` (GFAIR_JOBS): admissions, retries, the node executors' reports of what
  started and what let go, and the ends of jobs;
- ``split-stride-nodes`` (GFAIR_NODES): the servers (the cluster is whatever registered; the
  service keeps the inventory and gives the machine the servers it describes);
- ``split-stride-shares`` (GFAIR_SCHED): entitlements published by the trading auction, and the
  speed profiles and each job's switch costs published by the profiler.

A timer every ``quantum_s`` emits `QuantumTicked`, asks the machine for the quantum's plan, emits
`JobPlaced` for every job the kernel placed on other servers than before, then per server the
`SuspendCommand`s (or `KillCommand`s) of jobs leaving, the `StartCommand`s of jobs entering and
its `ScheduleDecided`. An event's reply from the machine is carried out the same way: a job
that fits idle GPUs starts at once, between ticks; a job opted in to a prepared start gets a
`PrepareCommand` where the machine put it. A start's command, environment and working directory
come from the job's record (written by placement). The clock is injected (`clock`), so tests
drive quanta by hand; a `journal` records every input the machine is given and its outcome
(from the state it starts from: a reload after a failed write starts it again from the record).

State is the `StrideRecord` in `gfair_stride` (its only writer; `record` converts), a key per
job and per server beside the cluster-wide one (`gfair.state.stride_record`). Every
handler and tick changes the machine, publishes its outputs under ids derived from what caused
them, and only then writes the record: a crash before the write replays the cause from the last
record and publishes the same ids again, which JetStream drops as duplicates. Handlers return
nothing to the runtime.

Handlers send their outputs without waiting for each to be stored and leave the record to their
batch's settling (`settle`), which waits for everything sent, then writes the record once for
the whole batch, before the runtime acknowledges the inputs: the jobs and servers the batch
changed, and the cluster-wide key. An output the broker does not acknowledge is published
again under its id until stored (a busy broker delays a quantum's commands; it does not have the
quantum decided twice). If sending fails otherwise, or writing fails, the machine is reloaded
from the record and the batch redelivered: it is handled again from what was stored. The job
admission (`JobAccepted`) carries what the job's starts need (its `launch`), which the machine
keeps with the job and the record with it: split-stride reads nothing of placement's, but for
the jobs of a record written before admissions carried it (`_with_launches`, as it loads).

The nodes' reports that processes let go (suspended, migrated, exited) are handed to the
machine together (`Releases`: one fill of the GPUs they leave idle instead of one per report):
a batch's run of them is held until another event of the batch, its settling or a tick comes,
and then applied in the order received. A quantum's suspends, hundreds at once on a large
cluster, so cost one fill per batch.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

import structlog
from opentelemetry import trace

from gfair.bus.dead_letter import set_aside
from gfair.bus.key_value import KeyValue, KvConflict
from gfair.bus.metrics import gfair_metrics
from gfair.bus.publisher import derived_event_id
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.service import Emit, Service
from gfair.bus.topology import consumer_for
from gfair.bus.tracing import current_traceparent
from gfair.bus.transport import BusError, PubAck
from gfair.core.scheduler import (
    Admitted,
    Ended,
    EntitlementsPublished,
    Exited,
    Journal,
    Launch,
    Migrated,
    Parked,
    Placement,
    Prepare,
    QuantumPlan,
    Releases,
    Reply,
    Retried,
    ServersChanged,
    ServerTurn,
    SplitStride,
    Start,
    Started,
    Starts,
    Stop,
    StopReason,
    Suspended,
    SwitchesMeasured,
    TimedOut,
    TypeProfiled,
    Unstartable,
)
from gfair.core.scheduler import Event as MachineEvent
from gfair.core.scheduler import JobEvent as MachineJobEvent
from gfair.core.switch_costs import MeasuredSwitches
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
    JobLaunch,
    JobMigrated,
    JobPlaced,
    JobResumed,
    JobRetried,
    JobStarted,
    JobSuspended,
)
from gfair.events.nodes import NodeEvent
from gfair.events.reasons import FailureClass, SuspendReason
from gfair.events.scheduling import (
    EntitlementsUpdated,
    ProfileUpdated,
    QuantumTicked,
    ScheduleDecided,
    SwitchCostsUpdated,
)
from gfair.events.states import JobState
from gfair.journal import Header, JournalFile
from gfair.state import buckets
from gfair.state.buckets import UnreadableRecord, job_key
from gfair.state.job_record import load_job, load_jobs
from gfair.state.stride_record import (
    MAX_APPLIED_IDS,
    PARTS_LAYOUT,
    StrideRecord,
    load_stride,
    save_stride,
)
from gfair_services.inventory import INVENTORY_EVENTS, NodeInventory
from gfair_services.profiler.seed import seed_table
from gfair_services.skeleton import Consumes, Every, declare, started

from . import record
from .settings import SplitStrideSettings

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
JOBS_CONSUMER = consumer_for(JOB_EVENTS, durable="split-stride-jobs")
# Job events waiting unread below this are a batch or two (a second's reading): heard, as far as
# forgetting a command goes (it waits `unconfirmed_release_s`, 15 s, at least).
CAUGHT_UP_UNREAD = 1_000
SHARES_EVENTS: tuple[type[EventData], ...] = (
    EntitlementsUpdated,
    ProfileUpdated,
    SwitchCostsUpdated,
)


_log = structlog.get_logger("gfair.split_stride")
_tracer = trace.get_tracer("gfair.split_stride")


class SplitStrideService:
    def __init__(
        self, settings: SplitStrideSettings, clock: Clock = utc_now, journal: Journal | None = None
    ) -> None:
        self.settings = settings
        self.clock = clock
        # Every input the state machine is given and its outcome (`gfair.core.scheduler`'s
        # journal), for a replay of a live run; a reload starts the machine from the record.
        self.journal = journal
        self._lock = asyncio.Lock()
        # Set when the state was unreadable and split-stride started afresh (`_load`).
        self._readmit = False
        self._machine: SplitStride | None = None
        self._records = record.Records()
        self.inventory = NodeInventory()
        self._epoch = ""
        self._applied: deque[str] = deque(maxlen=MAX_APPLIED_IDS)
        self._revision: int | None = None
        # The record as last stored (None: none is): a write stores what differs from it.
        self._written: StrideRecord | None = None
        self._runtime: ServiceRuntime | None = None
        self._stride_kv: KeyValue | None = None
        self._jobs_kv: KeyValue | None = None
        # Outputs sent and not yet known to be stored, in the order sent.
        self._sends: list[asyncio.Task[PubAck]] = []
        # The machine holds changes the record does not.
        self._dirty = False
        # Times the machine was reloaded from the record, and the count when each route's
        # unsettled batch began: a reload in between lost that batch's changes.
        self._loads = 0
        self._batch_began: dict[str, int] = {}
        # Reports of processes let go, not yet handed in (`_release_held`), with their events.
        self._held: list[tuple[Envelope, Suspended | Migrated | Exited]] = []
        # When the nodes' reports were last read up to (`_heard_until`); none yet.
        self._heard_at = -math.inf

    def service(self) -> Service:
        inputs = (
            ("jobs", self.on_job_event, JOB_EVENTS),
            ("nodes", self.on_node_event, INVENTORY_EVENTS),
            ("shares", self.on_shares_event, SHARES_EVENTS),
        )
        return declare(
            SERVICE_NAME,
            self.settings,
            start=self.start,
            consumes=[Consumes(n, h, events, settle=self._settler(n)) for n, h, events in inputs],
            timers=(Every("quantum", self.settings.quantum_s, self.on_tick, self._first_tick_in),),
        )

    @property
    def machine(self) -> SplitStride:
        return started(self._machine, "split-stride")

    # -- start ----------------------------------------------------------------------------------

    async def start(self, runtime: ServiceRuntime) -> None:
        self._runtime = runtime
        self._stride_kv = await runtime.key_value(buckets.STRIDE.name)
        self._jobs_kv = await runtime.key_value(buckets.JOBS.name)
        await self._load()
        if self._readmit:
            self._readmit = False
            await self._readmit_unfinished()
        _log.info(
            "split-stride state loaded",
            quantum=self.machine.quantum,
            jobs=len(self.machine.jobs),
            servers=len(self.inventory),
        )

    async def _load(self) -> None:
        assert self._stride_kv is not None
        try:
            stored = await load_stride(self._stride_kv)
        except UnreadableRecord as error:
            # Failing on it would stop every start in the cluster: it is set aside, and
            # split-stride starts afresh with placement's unfinished jobs.
            # What else the bucket holds is of the state that cannot be read: it goes too, so
            # that no part of it is read back into the fresh one.
            assert self._runtime is not None
            await set_aside(self._runtime.bus, error, service=SERVICE_NAME)
            for entry in await self._stride_kv.entries():
                await self._stride_kv.delete(entry.key)
            stored, self._readmit = None, True
        if stored is None:
            saved = StrideRecord.fresh(uuid.uuid4().hex, self.clock())
            self._revision, self._written = None, None
        else:
            saved, self._revision, self._written = stored.record, stored.revision, stored.record
            saved = await self._with_launches(saved)
        # alpha 1: each published profile replaces the last (the profiler already averaged).
        table = seed_table(self.settings.throughputs)
        estimator = ThroughputEstimator(table, alpha=1.0)
        config, state = self.settings.machine_config(), record.saved(saved)
        if isinstance(self.journal, JournalFile):  # a run per load, from what it starts with
            tickets, default = self.settings.user_tickets, self.settings.default_tickets
            self.journal.begin(Header(config, tickets, default, table, state))
        self._machine = SplitStride(config, estimator, state, journal=self.journal)
        self._records = record.Records()
        self.inventory = record.inventory(saved)
        self._epoch = saved.epoch
        self._applied = deque(saved.applied_event_ids, maxlen=MAX_APPLIED_IDS)
        self._held = []  # their batch is handed back, and they come again
        self._loads += 1
        # A record of the old layout, every job in one key, is stored in parts at once.
        self._dirty = stored is not None and saved.layout < PARTS_LAYOUT
        if self._dirty:
            _log.info(
                "gfair_stride holds the one-key record: storing it per job", jobs=len(saved.jobs)
            )

    async def _with_launches(self, saved: StrideRecord) -> StrideRecord:
        """`saved`, its jobs admitted before admissions carried their launch given it, read
        once from their records in placement's bucket (a job whose record is gone gets none,
        and cannot start); the first write after the load stores them with it."""
        missing = [job for job in saved.jobs.values() if job.launch is None]
        found = await asyncio.gather(*(load_job(self.jobs_kv, j.user, j.job_id) for j in missing))
        jobs = dict(saved.jobs)
        for job, stored in zip(missing, found, strict=True):
            if stored is not None:
                sub = stored.record.submission
                launch = _admitted_launch(stored.record.admission())
                update = {"launch": launch, "correlation_id": sub.event_id}
                jobs[job.key] = job.model_copy(update={**update, "trace_parent": sub.trace_parent})
        return saved.model_copy(update={"jobs": jobs}) if missing else saved

    def to_record(self, now: datetime) -> StrideRecord:
        """The record of what split-stride holds now, written at `now`."""
        return self._records.record(self.machine, self.inventory, self._epoch, self._applied, now)

    def _first_tick_in(self) -> float:
        """Seconds to the next tick of the grid the last tick set, across a restart too: a
        restarted split-stride decides when the quantum it took over ends (at once when that
        is past), not a whole quantum after it came back."""
        last = self.machine.last_tick_at
        if last is None:
            return self.settings.quantum_s
        return self.settings.quantum_s - (record.seconds(self.clock()) - last)

    # -- handlers -------------------------------------------------------------------------------

    async def on_job_event(self, envelope: Envelope, data: EventData) -> list[Emit]:
        async with self._lock:
            self._batch_began.setdefault("jobs", self._loads)
            if envelope.id in self._applied or not isinstance(data, JobEvent):
                return []
            given = _job_input(envelope, data, record.seconds(self.clock()))
            if isinstance(given, Suspended | Migrated | Exited):
                self._held.append((envelope, given))
                return []
            await self._release_held()
            outputs = await self._job_event(envelope, data, given)
            if outputs is None:
                return []
            self._commit(envelope, outputs, seed=envelope.id)
        return []

    async def _job_event(
        self, envelope: Envelope, data: JobEvent, given: MachineJobEvent | None
    ) -> list[EventData] | None:
        """The events to publish for `data` (the machine's input `given`, an admission's read
        here), or None when nothing changed."""
        key = job_key(data.user, data.job_id)
        if isinstance(data, JobAccepted):
            if key in self.machine.jobs:
                return None
            given = self._admitted(envelope, data, record.seconds(self.clock()))
        if given is None:
            return None
        reply = self.machine.apply(given)
        if reply.ignored is not None:
            _log.info(reply.ignored, job=key, event=data.EVENT_TYPE)
        if not reply.changed:
            return None
        return await self._reply_events(reply)

    async def _release_held(self) -> None:
        """Hand in the reports held (`Releases`), their outputs sent under the last one's id;
        hold the lock."""
        if not self._held:
            return
        held, self._held = self._held, []
        reply = self.machine.apply(Releases(tuple(report for _, report in held)))
        if reply.ignored is not None:
            _log.info(reply.ignored, reports=len(held))
        if not reply.changed:
            return
        outputs = await self._reply_events(reply)
        # Under the last report's id: a batch redelivered after a crash may be grouped
        # otherwise and send its starts under other ids; a node takes a start already in
        # effect as a no-op, and one on other GPUs as a move.
        last = held[-1][0]
        self._applied.extend(envelope.id for envelope, _ in held[:-1])
        self._commit(last, outputs, seed=last.id)

    def _admitted(self, envelope: Envelope, event: JobAccepted, now: float) -> Admitted:
        """An admitted job, as its admission says; its commands join the job's life (its
        correlation id, and its trace where this admission is handled)."""
        correlation_id, trace_parent = envelope.correlation_id or envelope.id, current_traceparent()
        return Admitted(
            user=event.user,
            job_id=event.job_id,
            now=now,
            gpus=event.gpus,
            weight=event.weight,
            job_type=event.job_type,
            attempt=event.attempt,
            array=event.array.id if event.array is not None else None,
            array_limit=event.array.limit if event.array is not None else None,
            prepare=event.prepare,
            launch=record.launch(_admitted_launch(event), correlation_id, trace_parent),
        )

    async def _readmit_unfinished(self) -> None:
        """After a fresh start over an unreadable state: every unfinished job placement holds
        is admitted again, as its admission said (it starts again from its checkpoints)."""
        unfinished = [
            stored.record
            for stored in await load_jobs(self.jobs_kv)
            if not stored.record.state.terminal and stored.record.state is not JobState.HELD
        ]
        async with self._lock:
            for job in unfinished:
                envelope = Envelope.wrap(job.admission(), source=SERVICE_NAME)
                outputs = await self._job_event(envelope, job.admission(), None)
                if outputs is not None:
                    self._commit(envelope, outputs, seed=envelope.id)
        _log.warning("split-stride took up placement's unfinished jobs", jobs=len(unfinished))

    async def on_node_event(self, envelope: Envelope, data: EventData) -> list[Emit]:
        async with self._lock:
            self._batch_began.setdefault("nodes", self._loads)
            if not isinstance(data, NodeEvent) or envelope.id in self._applied:
                return []
            if self.inventory.apply(envelope, data) is not None:
                self.machine.apply(ServersChanged(record.nodes(self.inventory)))
                self._commit(envelope, [], seed=envelope.id)
        return []

    async def on_shares_event(self, envelope: Envelope, data: EventData) -> list[Emit]:
        async with self._lock:
            self._batch_began.setdefault("shares", self._loads)
            given = _shares_input(data)
            if given is not None and self.machine.apply(given).changed:
                self._commit(envelope, [], seed=envelope.id)
        return []

    async def _heard_until(self, now: datetime) -> float:
        """Until when every report of the nodes has been read (`Tick.heard_until`): now, unless
        more than a batch or two of job events wait unread; then when that last held (the
        broker unreachable: likewise). Forgetting a command no node confirmed is timed by it."""
        assert self._runtime is not None
        try:
            unread = await self._runtime.bus.unread(JOBS_CONSUMER)
        except BusError as exc:
            _log.info("job events' backlog unknown: heard until as before", error=repr(exc))
            return self._heard_at
        if unread < CAUGHT_UP_UNREAD:
            self._heard_at = record.seconds(now)
        elif self._heard_at > -math.inf:
            _log.warning("job events wait unread: no command is forgotten meanwhile", unread=unread)
        return self._heard_at

    async def on_tick(self) -> list[Emit]:
        async with self._lock:
            await self._release_held()  # the quantum is decided from what let go before it
            now = self.clock()
            # Asked of the broker before the decision, which is timed without it.
            heard_until = await self._heard_until(now)
            with _tracer.start_as_current_span("split_stride.quantum") as span:
                began = time.perf_counter()
                plan = self.machine.tick(record.seconds(now), heard_until)
                gfair_metrics().record_quantum(time.perf_counter() - began, plan.waiting)
                gfair_metrics().record_shares(self.machine.held(), self.machine.entitlements)
                _log_plan(plan)
                span.set_attribute("gfair.quantum", plan.quantum)
                outputs: list[EventData] = [
                    QuantumTicked(
                        quantum=plan.quantum, starts_at=now, length_s=self.settings.quantum_s
                    )
                ]
                # Jobs past their time limit: killed before the plan's starts take their GPUs.
                for ended in plan.timed_out:
                    outputs += [_stop(kill, self.settings.yield_grace) for kill in ended.kills]
                    outputs.append(_timed_out(ended))
                outputs += [_placed(placement) for placement in plan.placed]
                outputs += await self._turns_events(plan.turns)
                outputs += [_stop(stop, self.settings.yield_grace) for stop in plan.strays]
                starts = sum(len(t.starts) for t in plan.turns)
                stops = sum(len(t.stops) for t in plan.turns) + len(plan.strays)
                span.set_attribute("gfair.starts", starts)
                span.set_attribute("gfair.stops", stops)
                # Inside the tick's span: its commands join their jobs' traces linked to it.
                self._commit(None, outputs, seed=f"{self._epoch}/quantum/{plan.quantum}")
                await self._store()
            if starts or stops:
                _log.info("quantum decided", quantum=plan.quantum, starts=starts, stops=stops)
        return []

    # -- outputs --------------------------------------------------------------------------------

    async def _reply_events(self, reply: Reply) -> list[EventData]:
        grace = self.settings.yield_grace
        outputs: list[EventData] = [_stop(stop, grace) for stop in reply.stops]
        outputs += await self._starts_events(reply.starts)
        for placement, prepare in reply.prepares:
            command = await self._prepare_command(prepare)
            outputs += [_placed(placement)] + ([command] if command is not None else [])
            _log.info(
                "prepared start", job=job_key(prepare.user, prepare.job_id), node_id=prepare.node_id
            )
        return outputs

    async def _prepare_command(self, prepare: Prepare) -> PrepareCommand | None:
        launch = self._launch_of(job_key(prepare.user, prepare.job_id))
        if launch is None:
            # Not started prepared: the machine gives it GPUs once its prepared wait is over.
            _log.error("no launch; cannot prepare it", job=job_key(prepare.user, prepare.job_id))
            return None
        return PrepareCommand(
            node_id=prepare.node_id,
            user=prepare.user,
            job_id=prepare.job_id,
            attempt=prepare.attempt,
            command=launch.command,
            env=dict(launch.env),
            working_dir=launch.working_dir,
            image=launch.image,
            mounts=launch.mounts,
            gpus=prepare.gpus,
            generation=prepare.generation,
            checkpoint_dir=self.settings.checkpoint_dir(prepare.user, prepare.job_id),
        )

    async def _starts_events(self, starts: Starts) -> list[EventData]:
        placed: list[EventData] = [_placed(placement) for placement in starts.placed]
        return placed + await self._turns_events(starts.turns)

    async def _turns_events(self, turns: Sequence[ServerTurn]) -> list[EventData]:
        outputs: list[EventData] = []
        grace = self.settings.yield_grace
        for turn in turns:
            outputs += [_stop(stop, grace) for stop in turn.stops]
            for start in turn.starts:
                if start.release is not None:
                    release = Stop(
                        start.user, start.job_id, start.release, start.attempt, StopReason.RELEASE
                    )
                    outputs.append(_stop(release, grace))
                command = await self._start_command(start)
                if command is not None:
                    outputs.append(command)
            outputs.append(
                ScheduleDecided(
                    quantum=turn.quantum,
                    server=turn.node_id,
                    running=tuple(_ref(key) for key in turn.running),
                    central=turn.central,
                )
            )
        return outputs

    def _launch_of(self, key: str) -> Launch | None:
        job = self.machine.jobs.get(key)
        return job.launch if job is not None else None

    async def _start_command(self, start: Start) -> StartCommand | None:
        launch = self._launch_of(start.key)
        if launch is None:
            _log.error("no launch (its job record was gone); cannot start it", job=start.key)
            self.machine.apply(
                Unstartable(
                    user=start.user,
                    job_id=start.job_id,
                    now=record.seconds(self.clock()),
                    node_id=start.node_id,
                )
            )
            return None
        with _tracer.start_as_current_span("split_stride.start") as span:
            span.set_attribute("gfair.user", start.user)
            span.set_attribute("gfair.job_id", start.job_id)
            span.set_attribute("gfair.gpus", len(start.gpu_indices))
            span.set_attribute("gfair.server", start.node_id)
            span.set_attribute("gfair.generation", start.generation or "")
            span.set_attribute("gfair.attempt", start.attempt)
        return StartCommand(
            node_id=start.node_id,
            user=start.user,
            job_id=start.job_id,
            attempt=start.attempt,
            command=launch.command,
            env={**launch.env, **self._gang_environment(start)},
            working_dir=launch.working_dir,
            image=launch.image,
            mounts=launch.mounts,
            gpu_indices=start.gpu_indices,
            checkpoint_dir=self.settings.checkpoint_dir(start.user, start.job_id),
            valid_until=None if start.valid_until is None else record.moment(start.valid_until),
        )

    def _gang_environment(self, start: Start) -> dict[str, str]:
        """For a part of a gang across servers, where the first part listens (gang_peers)."""
        if len(start.servers) < 2:
            return {}
        first = self.inventory.get(start.servers[0])
        return gang_environment(
            user=start.user,
            job_id=start.job_id,
            attempt=start.attempt,
            servers=start.servers,
            node_id=start.node_id,
            master_addr=first.hostname if first and first.hostname else start.servers[0],
            local_gpus=len(start.gpu_indices),
        )

    def _commit(self, cause: Envelope | None, outputs: list[EventData], *, seed: str) -> None:
        """Send `outputs` under ids derived from `seed`; the record follows in `_store`."""
        assert self._runtime is not None
        publisher = self._runtime.publisher
        for data in outputs:
            launch = self._launch_of(_job_key_of(data) or "")
            # A job's commands join its trace; a server's decision links the jobs it runs.
            running = data.running if isinstance(data, ScheduleDecided) else ()
            self._sends.append(
                publisher.send(
                    data,
                    causation=cause,
                    correlation_id=launch.correlation_id if launch is not None else None,
                    event_id=derived_event_id(seed, 0, data.EVENT_TYPE, _identity(data)),
                    trace_parent=launch.trace_parent if launch is not None else None,
                    links=[self._trace_parent(job_key(r.user, r.job_id)) for r in running],
                    # A busy broker delays a quantum's commands; it does not make the quantum
                    # be decided again (a reload and a redo double the work under overload).
                    persist=True,
                )
            )
        if cause is not None:
            self._applied.append(cause.id)
        self._dirty = True

    async def _store(self) -> None:
        """Wait for everything sent to be stored, then write the record; hold the lock.

        On failure the machine is reloaded from the record: it must not keep changes whose
        outputs may never have gone out, or that the record does not hold. (Outputs the broker
        is only slow to acknowledge are published again until stored, `persist`; they fail
        only as the service stops or for a cause no repeat mends, a missing stream.)
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
        record_now = self.to_record(self.clock())
        try:
            stored = await save_stride(
                self._stride_kv,
                record_now,
                self._revision,
                self._written,
                changed_jobs=self._records.changed_jobs,
            )
        except KvConflict:
            # Another writer (a second split-stride?) moved the record: start again from it.
            _log.error("gfair_stride changed under us; reloading")
            await self._load()
            raise
        except Exception:
            await self._load()
            raise
        self._revision, self._written = stored.revision, stored.record
        self._records.stored()
        self._dirty = False

    def _settler(self, route: str) -> Callable[[], Awaitable[None]]:
        """Settles a batch of `route`: its outputs stored and the record written."""

        async def settle() -> None:
            async with self._lock:
                began = self._batch_began.pop(route, self._loads)
                await self._release_held()
                await self._store()
                if began != self._loads:
                    raise RuntimeError(
                        "the state was reloaded while the batch was handled; handling it again"
                    )

        return settle

    def _trace_parent(self, key: str) -> str | None:
        launch = self._launch_of(key)
        return launch.trace_parent if launch is not None else None

    @property
    def jobs_kv(self) -> KeyValue:
        return started(self._jobs_kv, "split-stride")


def _job_input(envelope: Envelope, data: JobEvent, now: float) -> MachineJobEvent | None:
    """The state machine's input for a job event (an admission aside: `_admitted`)."""
    user, job_id, at = data.user, data.job_id, record.seconds(envelope.time)
    match data:
        case JobSuspended() if data.reason is SuspendReason.PREPARED:
            return Parked(
                user=user, job_id=job_id, now=now, node_id=data.node_id, attempt=data.attempt
            )
        case JobRetried():
            return Retried(
                user=user, job_id=job_id, now=now, attempt=data.attempt, at=at, delay_s=data.delay_s
            )
        case JobStarted() | JobResumed():
            return Started(
                user=user,
                job_id=job_id,
                now=now,
                node_id=data.node_id,
                attempt=data.attempt,
                gpu_indices=data.gpu_indices,
                at=at,
            )
        case JobSuspended():
            return Suspended(
                user=user,
                job_id=job_id,
                now=now,
                node_id=data.node_id,
                attempt=data.attempt,
                in_place=data.in_place,
                at=at,
                starting=data.starting,
            )
        case JobMigrated():
            return Migrated(user=user, job_id=job_id, now=now, node_id=data.from_node, at=at)
        case JobExited():
            return Exited(
                user=user, job_id=job_id, now=now, node_id=data.node_id, attempt=data.attempt, at=at
            )
        case JobCompleted() | JobFailed() | JobCancelled():
            return Ended(user=user, job_id=job_id, now=now, state=data.JOB_STATE or "over")
    return None


def _shares_input(data: EventData) -> MachineEvent | None:
    match data:
        case EntitlementsUpdated():
            return EntitlementsPublished(data.revision, data.entitlements)
        case ProfileUpdated() if data.job_id is None:
            # A user's profile of a job type (per-job estimates refine little beyond it).
            return TypeProfiled(data.user, data.job_type, data.rates)
        case SwitchCostsUpdated():
            return SwitchesMeasured(
                data.user,
                data.job_id,
                data.reports,
                MeasuredSwitches(data.yield_s, data.resume_in_place_s, data.cold_start_s),
            )
    return None


def _log_plan(plan: QuantumPlan) -> None:
    for forgotten in plan.forgotten:
        _log.warning(
            "node never confirmed; forgetting",
            job=forgotten.job,
            node_id=forgotten.node_id,
            phase=forgotten.phase,
            start_confirmed=forgotten.start_confirmed,
        )
    for key, node_id in plan.short:
        _log.error("not enough free GPUs for a chosen job", job=key, node_id=node_id)


def _placed(placement: Placement) -> JobPlaced:
    return JobPlaced(
        user=placement.user,
        job_id=placement.job_id,
        servers=placement.servers,
        generation=placement.generation,
        chosen_by=placement.chosen_by,
    )


def _ref(key: str) -> JobRef:
    user, _, job_id = key.partition(".")
    return JobRef(user=user, job_id=job_id)


def _job_key_of(data: EventData) -> str | None:
    if isinstance(data, NodeCommand | JobEvent):
        return job_key(data.user, data.job_id)
    return None


def _timed_out(ended: TimedOut) -> JobFailed:
    """The job's end, the machine's verdict: it ran past its time limit (never retried)."""
    job = {"user": ended.user, "job_id": ended.job_id, "attempt": ended.attempt}
    return JobFailed.model_validate(
        {**job, "failure_class": FailureClass.TIME_LIMIT, "reason": ended.reason}
    )


def _identity(data: EventData) -> str:
    """What makes an output unique within its cause: subject plus the job or server."""
    detail = _job_key_of(data)
    if isinstance(data, ScheduleDecided):
        detail = data.server
    return f"{data.subject()}/{detail or ''}"


# How each of the machine's stops is told: the grace a suspend carries is enforced by the node
# (a job ignoring it cannot hold the GPUs the next job waits for); a drain off a quarantined
# node, or a parked process let go, waits for nobody: the node's own timeout.
_SUSPENDS: dict[StopReason, tuple[SuspendReason, bool]] = {
    StopReason.TIME_SLICE: (SuspendReason.TIME_SLICE, True),
    StopReason.MIGRATION: (SuspendReason.MIGRATION, True),
    StopReason.DRAIN: (SuspendReason.DRAIN, False),
    StopReason.RELEASE: (SuspendReason.MIGRATION, False),
}


def _stop(stop: Stop, grace_s: float) -> KillCommand | SuspendCommand:
    if not isinstance(stop.reason, StopReason):
        return KillCommand(
            node_id=stop.node_id,
            user=stop.user,
            job_id=stop.job_id,
            attempt=stop.attempt,
            reason=stop.reason,
        )
    reason, graced = _SUSPENDS[stop.reason]
    return SuspendCommand(
        node_id=stop.node_id,
        user=stop.user,
        job_id=stop.job_id,
        attempt=stop.attempt,
        reason=reason,
        yield_grace_s=grace_s if graced else None,
    )


def build_service(settings: SplitStrideSettings | None = None, clock: Clock = utc_now) -> Service:
    settings = settings or SplitStrideSettings()
    journal = JournalFile(settings.journal) if settings.journal is not None else None
    return SplitStrideService(settings, clock, journal).service()


def _admitted_launch(admission: JobAccepted) -> JobLaunch:
    """What the admitted job's starts need: its launch, with its job array's variables."""
    launch = admission.launch
    return launch.model_copy(update={"env": {**launch.env, **array_environment(admission.array)}})
