"""The discrete-event trace simulator: virtual time in quanta, one policy, one cluster.

Every quantum the policy decides which jobs hold GPUs where (`Policy.plan`); the simulator
executes the decision, charges switching costs as lost progress, and advances each running job's
work (V100-equivalent seconds) at its speed on the generation it runs on. Jobs arrive and finish
at their exact times; a decision is only taken on quantum boundaries, so a job's GPUs idle from
its completion to the next boundary, as on a real quantum-driven cluster.

The clock skips what cannot change anything: when nothing runs and no admitted job waits, it jumps
to the next arrival (re-anchoring the quantum grid there); when the policy promises its decision
holds until the next arrival or completion (`Policy.quiet_until`), it jumps to the first quantum
boundary at or after that event without asking. Progress is computed lazily per run segment, so
a quantum in which nothing changes costs a comparison of two mappings.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from gfair.core.admission import (
    Admit,
    Admitter,
    Arrived,
    Cancel,
    Decision,
    DependencyOutcome,
    Finished,
    Refuse,
)
from gfair.core.cluster import Cluster
from gfair.core.kernel import DEFAULT_QUANTUM_S
from gfair.core.packing import Packing
from gfair.core.shares_tree import ShareTree
from gfair.core.switch_costs import SwitchCosts as SwitchCosts
from gfair.sim.idle_capacity import WaitingClass, usable_idle_gpus
from gfair.sim.ledger import Ledger, ShareSeries
from gfair.sim.policy import Backfilling, LimitingArrays, Policy
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import Trace, TraceJob

# Stall guard: this many consecutive decisions that run nothing while admitted jobs wait and no
# arrival is due means the policy will never run them.
_STALL_LIMIT: Final = 10_000
_EPSILON: Final = 1e-9
_MIN_NOISY_RATE: Final = 0.05  # noise never reports a job as stopped or backwards


@dataclass(frozen=True)
class SimConfig:
    quantum_s: float = DEFAULT_QUANTUM_S
    # Each job's switching costs unless its trace row gives its own (`TraceJob.costs`)
    costs: SwitchCosts = field(default_factory=SwitchCosts)
    until_s: float | None = None  # stop the clock here (backlogged experiments)
    tickets: Mapping[str, float] | None = None  # per user; None: the trace's
    default_tickets: float = 1.0
    shares: ShareTree | None = None  # accounts the ledger's entitlements go down
    series_bucket_s: float | None = None  # keep a ShareSeries with this initial bucket width
    series_max_buckets: int = 4096
    # Relative standard deviation of the rates reported to the policy's profiler (measurement
    # noise; progress itself always follows the true speed), drawn from `seed`.
    rate_noise: float = 0.0
    seed: int = 0


class PlanError(RuntimeError):
    """The policy's decision cannot be executed (an oversubscribed server, an unknown job)."""


class SimulationStalled(RuntimeError):
    """Admitted jobs wait forever: the policy runs nothing and no arrival is due."""


class TimelineSink(Protocol):
    def quantum(self, now: float, runs: Mapping[str, list[str]]) -> None: ...


@dataclass(frozen=True, slots=True)
class JobOutcome:
    id: str
    user: str
    gpus: int
    submit_s: float
    start_s: float | None
    end_s: float | None
    ideal_s: float
    # "completed", "failed" (ended past its time limit), "unfinished" (clock stopped first) or
    # "rejected"
    status: str
    reason: str = ""


@dataclass(frozen=True)
class SimResult:
    policy: str
    cluster: Cluster
    quantum_s: float
    jobs: tuple[JobOutcome, ...]
    ledger: Ledger
    start_s: float
    end_s: float
    suspends: int
    migrations: int
    trades: int
    plans: int
    quanta: int
    wall_s: float
    sched_cpu_s: float
    # Time during which jobs that the last decision left without GPUs wait, the GPU-seconds
    # jobs held meanwhile (the report's ``busy_while_waiting``), and the GPU-seconds idle that
    # those jobs could have used (``idle_while_fitting``, `gfair.sim.idle_capacity`).
    waiting_s: float = 0.0
    busy_waiting_gpu_s: float = 0.0
    usable_idle_gpu_s: float = 0.0
    running_job_s: float = 0.0  # seconds jobs held GPUs, summed over jobs (not their GPUs)


class _Job:
    """A job's live state. Progress is booked lazily at segment ends."""

    __slots__ = (
        "end_s",
        "epoch",
        "last_servers",
        "remaining",
        "seg_start",
        "servers",
        "since",
        "spec",
        "speed",
        "start_s",
    )

    def __init__(self, spec: TraceJob) -> None:
        self.spec = spec
        self.remaining = spec.duration_s  # V100-seconds of work left as of `since`
        self.servers: tuple[str, ...] = ()  # where it holds GPUs now; () when not running
        self.last_servers: tuple[str, ...] = ()
        self.speed = 0.0
        self.since = 0.0  # productive from here (after the switching cost)
        self.seg_start = 0.0  # holds GPUs from here
        self.start_s: float | None = None
        self.end_s: float | None = None
        self.epoch = 0  # invalidates stale completion-heap entries


class Simulator:
    """Replays `trace` on `cluster` under `policy`. One use: call `run()` once."""

    def __init__(
        self,
        trace: Trace,
        cluster: Cluster,
        policy: Policy,
        speeds: SpeedModel,
        config: SimConfig | None = None,
        timeline: TimelineSink | None = None,
        progress: Callable[[float, int], None] | None = None,
    ) -> None:
        self.trace = trace
        self.cluster = cluster
        self.policy = policy
        self._filler = policy if isinstance(policy, Backfilling) else None
        # A policy that does not limit arrays has admission hold their members to the limit.
        self._gates_arrays = not isinstance(policy, LimitingArrays)
        self.speeds = speeds
        self.config = config or SimConfig()
        if not self.config.quantum_s > 0:
            raise ValueError(f"quantum must be > 0 s, got {self.config.quantum_s}")
        self.timeline = timeline
        self.progress = progress
        for job in trace.jobs:
            try:
                speeds.check(job.job_type)
            except KeyError:
                known = ", ".join(sorted(speeds.job_types))
                raise ValueError(
                    f"{trace.source}:{job.line}: column 'job_type': unknown job type "
                    f"{job.job_type!r}; known: {known}"
                ) from None
        self._server_gpus = {server.id: server.gpus for server in cluster.servers}
        self._capacity = sum(self._server_gpus.values())
        self._server_generation = {server.id: server.generation for server in cluster.servers}
        start = trace.jobs[0].submit_s if trace.jobs else 0.0
        series = None
        if self.config.series_bucket_s is not None:
            series = ShareSeries(
                cluster.total_gpus,
                start,
                self.config.series_bucket_s,
                self.config.series_max_buckets,
            )
        tickets = trace.tickets if self.config.tickets is None else self.config.tickets
        self.ledger = Ledger(
            cluster.total_gpus, tickets, self.config.default_tickets, series, self.config.shares
        )
        self._jobs: dict[str, _Job] = {}
        self._outcomes: dict[str, JobOutcome] = {}
        self._active = 0  # admitted, unfinished
        self._running = 0  # admitted, unfinished, holding GPUs
        self._held_gpus = 0  # GPUs the running jobs requested
        self._left_waiting = 0  # admitted jobs the last decision gave no GPUs
        self._tally_at = trace.jobs[0].submit_s if trace.jobs else 0.0
        self._waiting_s = 0.0
        self._busy_waiting_gpu_s = 0.0
        # For idle_while_fitting: free GPUs per server; (GPUs, job type) of the admitted jobs
        # holding none, and of those among them admitted since the last decision (no policy
        # could have started them yet); the idle GPUs the others could use (None: to count
        # again), and its integral.
        self._free = dict(self._server_gpus)
        self._unplaced: Counter[tuple[int, str | None]] = Counter()
        self._arrived: Counter[tuple[int, str | None]] = Counter()
        self._arrived_ids: set[str] = set()
        self._usable: int | None = 0
        self._usable_idle_gpu_s = 0.0
        self._type_pools: dict[str | None, tuple[str, ...]] = {}
        self._next_arrival = 0
        self._runs: dict[str, list[str]] = {}  # server -> jobs holding GPUs now
        self._decided: dict[str, tuple[str, ...]] = {}  # the last decision as given
        self._completions: list[tuple[float, int, str]] = []
        self._unobserved: list[_Job] = []
        self._observed: set[tuple[str, str]] = set()
        self._noise = random.Random(self.config.seed)
        self._suspends = 0
        self._migrations = 0
        self._running_job_s = 0.0
        self._trades = 0
        self._plans = 0
        self._quanta = 0
        self._finished = 0
        self._sched_cpu = 0.0
        self._idle_plans = 0
        self._vacated: set[str] = set()  # servers where jobs finished since the last decision
        # Dependencies and array holds (gfair.core.admission), as placement decides them: a
        # held job reaches the policy when admission releases it.
        self._admission = Admitter()
        self._specs: dict[str, TraceJob] = {}  # the arrived jobs

    # The loop ----------------------------------------------------------------------------

    def run(self) -> SimResult:
        wall_start = time.perf_counter()
        quantum = self.config.quantum_s
        until = self.config.until_s if self.config.until_s is not None else math.inf
        jobs = self.trace.jobs
        start = jobs[0].submit_s if jobs else 0.0
        now = start
        self._arrive_until(now)
        while (self._active or self._next_arrival < len(jobs)) and now < until:
            if not self._active:
                # Nothing runs and nothing waits: jump to the next arrival.
                now = min(jobs[self._next_arrival].submit_s, until)
                self._arrive_until(now)
                continue
            self._observe(now)
            began = time.process_time()
            decision = self.policy.plan(now)
            quiet = self.policy.quiet_until(now)
            self._sched_cpu += time.process_time() - began
            self._plans += 1
            self._trades += decision.trades
            for job_id, reason in decision.ended.items():
                self._end(self._jobs[job_id], now, reason)
            self._apply(decision.runs, now)
            self._tally(now)
            self._left_waiting = self._active - self._running
            self._arrived.clear()
            self._arrived_ids.clear()
            self._usable = None
            self._check_stall(now)
            step = self._step(now, quiet, quantum)
            end = min(now + step * quantum, until)
            if self.timeline is not None:
                boundary = now
                while boundary < end - _EPSILON:
                    self._advance(boundary)
                    self.timeline.quantum(boundary, self._runs)
                    boundary += quantum
            self._advance(end)
            self._quanta += max(1, math.ceil((end - now) / quantum - _EPSILON))
            now = end
            if self.progress is not None and self._plans % 64 == 0:
                self.progress(now, self._finished)
        return self._result(now, start, wall_start)

    def _step(self, now: float, quiet: float, quantum: float) -> int:
        """Quanta until the next decision: 1, or more when the policy is quiet until then."""
        if quiet <= now + quantum:
            return 1
        target = quiet
        if self._next_arrival < len(self.trace.jobs):
            target = min(target, self.trace.jobs[self._next_arrival].submit_s)
        target = min(target, self._next_completion())
        if math.isinf(target):
            return 1
        return max(1, math.ceil((target - now) / quantum - _EPSILON))

    def _next_completion(self) -> float:
        heap = self._completions
        while heap:
            at, epoch, job_id = heap[0]
            job = self._jobs[job_id]
            if job.epoch == epoch and job.end_s is None:
                return at
            heapq.heappop(heap)
        return math.inf

    def _advance(self, until: float) -> None:
        """Process completions and arrivals up to `until`, in time order."""
        jobs = self.trace.jobs
        heap = self._completions
        while True:
            arrival = (
                jobs[self._next_arrival].submit_s if self._next_arrival < len(jobs) else math.inf
            )
            completion = self._next_completion()
            if min(arrival, completion) > until:
                return
            if completion <= arrival:
                _, _, job_id = heapq.heappop(heap)
                self._complete(self._jobs[job_id], completion)
                self._fill(completion)
            else:
                self._arrive_until(arrival)
                self._fill(arrival)

    def _fill(self, now: float) -> None:
        """Start what a backfilling policy puts on GPUs left idle between decisions."""
        if (
            self._filler is None
            or self._active <= self._running
            or self._held_gpus >= self._capacity
            or self._plans == 0
        ):
            return
        began = time.process_time()
        started = self._filler.fill(now)
        self._sched_cpu += time.process_time() - began
        for job_id, servers in started.items():
            job = self._jobs.get(job_id)
            if job is None or job.end_s is not None or job.servers:
                raise PlanError(
                    f"{self.policy.name}: backfill starts {job_id!r}, which is not a waiting job"
                )
            if len(servers) > 1:
                self._check_gang(job, servers)
            self._start(job, servers, now)
            for server in servers:
                self._runs.setdefault(server, []).append(job_id)
                self._vacated.add(server)  # the next decision compares against it
                self._check_capacity(server)
        if started:
            self._left_waiting = self._active - self._running

    def _arrive_until(self, now: float) -> None:
        jobs = self.trace.jobs
        while self._next_arrival < len(jobs) and jobs[self._next_arrival].submit_s <= now:
            spec = jobs[self._next_arrival]
            self._next_arrival += 1
            self._submit(spec)

    # Job life ----------------------------------------------------------------------------

    def _submit(self, spec: TraceJob) -> None:
        self._specs[spec.id] = spec
        array = spec.array if self._gates_arrays else None
        submitted = Arrived(spec.user, spec.id, spec.after_ok, array, spec.array_limit)
        self._carry_out(self._admission.apply(submitted), spec.submit_s)

    def _carry_out(self, decisions: list[Decision], now: float) -> None:
        """Admission's decisions: the admitted jobs go to the policy, the refused ones end."""
        for decision in decisions:
            match decision:
                case Admit():
                    self._admit(self._specs[decision.job_id], now)
                case Refuse() | Cancel():
                    self._refuse(self._specs[decision.job_id], decision.reason, now)

    def _admit(self, spec: TraceJob, now: float) -> None:
        began = time.process_time()
        admission = self.policy.submit(spec, now)
        self._sched_cpu += time.process_time() - began
        if not admission.accepted:
            self._refuse(spec, admission.reason, now)
            refused = Finished(spec.user, spec.id, DependencyOutcome.REJECTED)
            self._carry_out(self._admission.apply(refused), now)
            return
        if spec.id in self._jobs:
            raise ValueError(f"{self.trace.source}:{spec.line}: duplicate job id {spec.id!r}")
        self._tally(now)
        self._jobs[spec.id] = _Job(spec)
        self._unplaced[spec.gpus, spec.job_type] += 1
        self._arrived[spec.gpus, spec.job_type] += 1
        self._arrived_ids.add(spec.id)
        self._active += 1
        self.ledger.admit(now, spec.user, spec.gpus)

    def _refuse(self, spec: TraceJob, reason: str, now: float) -> None:
        """Rejected, or never to run because a dependency will not complete (`reason`)."""
        self._outcomes[spec.id] = self._outcome(spec, "rejected", reason)
        self.ledger.account(spec.user)

    def _complete(self, job: _Job, at: float) -> None:
        spec = job.spec
        self.ledger.used(spec.user, spec.gpus, job.seg_start, at, job.remaining)
        self._running_job_s += at - job.seg_start
        self._tally(at)
        self._hold(job.servers, spec.gpus, -1)
        self._running -= 1
        self._held_gpus -= spec.gpus
        job.remaining = 0.0
        job.end_s = at
        for server in job.servers:
            self._runs[server].remove(spec.id)
            self._vacated.add(server)
        job.servers = ()
        self._leave(job, at, DependencyOutcome.COMPLETED)

    def _end(self, job: _Job, at: float, reason: str) -> None:
        """The policy ended the job unfinished (past its time limit): it failed."""
        spec = job.spec
        if job.servers:
            self._stop(job, at)
            for server in job.last_servers:
                self._runs[server].remove(spec.id)
                self._vacated.add(server)
        self._unplaced[spec.gpus, spec.job_type] -= 1
        job.end_s = at
        self._outcomes[spec.id] = self._outcome(spec, "failed", reason, job)
        self._leave(job, at, DependencyOutcome.FAILED)

    def _leave(self, job: _Job, at: float, outcome: DependencyOutcome) -> None:
        """The job is over (`outcome`): the policy is told, and what waited for it follows."""
        spec = job.spec
        self._active -= 1
        self._finished += 1
        self.ledger.depart(at, spec.user, spec.gpus)
        began = time.process_time()
        self.policy.finish(spec.id, at)
        self._sched_cpu += time.process_time() - began
        self._carry_out(self._admission.apply(Finished(spec.user, spec.id, outcome)), at)

    def _stop(self, job: _Job, now: float) -> None:
        """Book the segment that ends at `now` (the job keeps its remaining work)."""
        done = max(0.0, now - job.since) * job.speed
        done = min(done, job.remaining)
        self.ledger.used(job.spec.user, job.spec.gpus, job.seg_start, now, done)
        self._running_job_s += now - job.seg_start
        self._tally(now)
        self._hold(job.servers, job.spec.gpus, -1)
        self._unplaced[job.spec.gpus, job.spec.job_type] += 1
        self._running -= 1
        self._held_gpus -= job.spec.gpus
        job.remaining -= done
        job.last_servers = job.servers
        job.servers = ()
        job.epoch += 1

    def _start(self, job: _Job, servers: tuple[str, ...], now: float) -> None:
        costs = job.spec.costs(self.config.costs)
        if servers == job.last_servers:
            # Resuming in place, the common case when time-slicing: same speed, already seen.
            overhead = costs.resume_s
        else:
            if job.start_s is None:
                job.start_s = now
                overhead = 0.0
            else:
                overhead = costs.migration_s
                self._migrations += 1
            if len(servers) == 1:  # most jobs: their generation's speed, without a set of one
                generation = self._server_generation[servers[0]]
                job.speed = self.speeds.speed(job.spec.job_type, generation)
                if (job.spec.id, generation) not in self._observed:
                    self._unobserved.append(job)
            else:
                generations = {self._server_generation[server] for server in servers}
                job.speed = self.speeds.gang_speed(job.spec.job_type, generations)
                if any((job.spec.id, g) not in self._observed for g in generations):
                    self._unobserved.append(job)
        self._tally(now)
        self._hold(servers, job.spec.gpus, 1)
        kind = (job.spec.gpus, job.spec.job_type)
        self._unplaced[kind] -= 1
        if job.spec.id in self._arrived_ids:
            self._arrived_ids.discard(job.spec.id)
            self._arrived[kind] -= 1
        self._running += 1
        self._held_gpus += job.spec.gpus
        job.servers = servers
        job.seg_start = now
        job.since = now + overhead
        job.epoch += 1
        heapq.heappush(
            self._completions, (job.since + job.remaining / job.speed, job.epoch, job.spec.id)
        )

    def _tally(self, now: float) -> None:
        """Integrate the waiting-time books up to `now`; call before any count changes.

        Only jobs the last decision left waiting count: they wait until the next decision at
        least (nothing starts between decisions). Jobs that arrived since could not have been
        started by any policy yet, so the quantum grid alone does not count as idling."""
        elapsed = now - self._tally_at
        if elapsed > 0 and self._left_waiting > 0:
            self._waiting_s += elapsed
            self._busy_waiting_gpu_s += self._held_gpus * elapsed
            self._usable_idle_gpu_s += self._usable_idle() * elapsed
        self._tally_at = max(self._tally_at, now)

    def _hold(self, servers: tuple[str, ...], gpus: int, sign: int) -> None:
        """A job takes (+1) or gives back (-1) its GPUs on `servers`."""
        for server in servers:
            self._free[server] -= sign * (gpus if len(servers) == 1 else self._server_gpus[server])
        self._usable = None

    def _usable_idle(self) -> int:
        """Idle GPUs that the jobs the last decision left waiting could take now."""
        if self._usable is None:
            if self._held_gpus >= self._capacity:
                self._usable = 0  # no GPU is idle (the common case on a busy cluster)
                return 0
            waiting = [
                WaitingClass(gpus, self._pools_for(job_type), count)
                for (gpus, job_type), count in (self._unplaced - self._arrived).items()
            ]
            rooms = {
                pool: Packing(self.cluster.by_generation(pool), self._free)
                for pool in self.cluster.generations
            }
            self._usable = usable_idle_gpus(rooms, waiting) if waiting else 0
        return self._usable

    def _pools_for(self, job_type: str | None) -> tuple[str, ...]:
        pools = self._type_pools.get(job_type)
        if pools is None:
            pools = tuple(g for g in self.cluster.generations if self.speeds.speed(job_type, g) > 0)
            self._type_pools[job_type] = pools
        return pools

    def _observe(self, now: float) -> None:
        """Report the rate of jobs that ran a quantum on a generation new to them.

        Rates are deterministic in the simulator, so one report per job and generation is what
        a profiler would converge to.
        """
        pending, self._unobserved = self._unobserved, []
        for job in pending:
            if job.end_s is not None or not job.servers:
                continue
            generations = {self._server_generation[server] for server in job.servers}
            slowest = min(generations, key=lambda g: self.speeds.speed(job.spec.job_type, g))
            for generation in generations:
                self._observed.add((job.spec.id, generation))
            rate = job.speed
            if self.config.rate_noise > 0:
                rate *= max(_MIN_NOISY_RATE, self._noise.gauss(1.0, self.config.rate_noise))
            began = time.process_time()
            self.policy.observe(job.spec.id, slowest, rate, now)
            self._sched_cpu += time.process_time() - began

    # Executing a decision ----------------------------------------------------------------

    def _apply(self, runs: Mapping[str, tuple[str, ...]], now: float) -> None:
        previous = self._decided
        if not self._vacated and runs == previous:
            return
        changed = {server for server, wanted in runs.items() if previous.get(server) != wanted}
        changed.update(server for server in previous if server not in runs)
        changed.update(self._vacated)
        self._vacated.clear()
        jobs = self._jobs
        # Job -> its servers after this decision, for the jobs whose servers change. Sets are
        # walked in sorted order: the order jobs stop and start in orders their later events,
        # and a replay must not depend on the process's string hashing.
        moving: dict[str, set[str]] = {}
        for server in sorted(changed):
            wanted = set(runs.get(server, ()))
            held = set(self._runs.get(server, ()))
            if wanted == held:
                continue
            if server not in self._server_gpus:
                raise PlanError(f"{self.policy.name}: unknown server {server!r}")
            for job_id in sorted(wanted ^ held):
                servers = moving.get(job_id)
                if servers is None:
                    job = jobs.get(job_id)
                    if job is None or job.end_s is not None:
                        raise PlanError(
                            f"{self.policy.name}: server {server} runs {job_id!r}, which is "
                            "not an admitted unfinished job"
                        )
                    servers = moving[job_id] = set(job.servers)
                if job_id in wanted:
                    servers.add(server)
                else:
                    servers.discard(server)
        for job_id, server_set in moving.items():
            job = jobs[job_id]
            placed = tuple(sorted(server_set)) if len(server_set) > 1 else tuple(server_set)
            if placed == job.servers:
                continue
            was_running = bool(job.servers)
            if was_running:
                self._stop(job, now)
            if placed:
                if len(placed) > 1:  # one server: `_check_capacity` covers it
                    self._check_gang(job, placed)
                self._start(job, placed, now)
            elif was_running:
                self._suspends += 1
        for server in changed:
            self._runs[server] = list(runs.get(server, ()))
            self._check_capacity(server)
        self._decided = dict(runs)

    def _check_gang(self, job: _Job, servers: tuple[str, ...]) -> None:
        held = sum(self._server_gpus[server] for server in servers)
        if held < job.spec.gpus:
            raise PlanError(
                f"{self.policy.name}: job {job.spec.id} needs {job.spec.gpus} GPUs, got servers "
                f"{list(servers)} with {held}"
            )

    def _check_capacity(self, server: str) -> None:
        used = 0
        for job_id in self._runs[server]:
            job = self._jobs[job_id]
            used += job.spec.gpus if len(job.servers) == 1 else self._server_gpus[server]
        if used > self._server_gpus[server]:
            raise PlanError(
                f"{self.policy.name}: server {server} has {self._server_gpus[server]} GPUs, "
                f"decision uses {used} ({self._runs[server]})"
            )

    def _check_stall(self, now: float) -> None:
        if any(self._runs.values()) or self._next_arrival < len(self.trace.jobs):
            self._idle_plans = 0
            return
        self._idle_plans += 1
        if self._idle_plans >= _STALL_LIMIT:
            raise SimulationStalled(
                f"{self.policy.name}: {self._active} admitted job(s) have waited "
                f"{_STALL_LIMIT} decisions at t={now:.0f}s with nothing running"
            )

    # Result ------------------------------------------------------------------------------

    def _ideal(self, spec: TraceJob) -> float:
        return spec.duration_s / self.speeds.fastest(spec.job_type, self.cluster.generations)

    def _outcome(
        self, spec: TraceJob, status: str, reason: str = "", job: _Job | None = None
    ) -> JobOutcome:
        """`spec`'s outcome: `job`'s run (None: it never ran), `status` and why."""
        return JobOutcome(
            id=spec.id,
            user=spec.user,
            gpus=spec.gpus,
            submit_s=spec.submit_s,
            start_s=None if job is None else job.start_s,
            end_s=None if job is None else job.end_s,
            ideal_s=self._ideal(spec),
            status=status,
            reason=reason,
        )

    def _result(self, now: float, start: float, wall_start: float) -> SimResult:
        """Close the books at `now`; jobs not yet submitted when the clock stopped are left out."""
        self._tally(now)
        for job in self._jobs.values():
            if job.servers:
                self._stop(job, now)
        self.ledger.close(now)
        outcomes: list[JobOutcome] = []
        last_end = start
        for spec in self.trace.jobs[: self._next_arrival]:
            outcome = self._outcomes.get(spec.id)
            held = None if outcome is not None else self._admission.held(spec.user, spec.id)
            if held is not None:
                outcome = self._outcome(spec, "unfinished", "held: " + held)
            if outcome is None:
                job = self._jobs[spec.id]
                status = "completed" if job.end_s is not None else "unfinished"
                outcome = self._outcome(spec, status, job=job)
                if job.end_s is not None:
                    last_end = max(last_end, job.end_s)
            outcomes.append(outcome)
        end = last_end if self._active == 0 else now
        return SimResult(
            policy=self.policy.name,
            cluster=self.cluster,
            quantum_s=self.config.quantum_s,
            jobs=tuple(outcomes),
            ledger=self.ledger,
            start_s=start,
            end_s=end,
            suspends=self._suspends,
            migrations=self._migrations,
            trades=self._trades,
            plans=self._plans,
            quanta=self._quanta,
            wall_s=time.perf_counter() - wall_start,
            sched_cpu_s=self._sched_cpu,
            waiting_s=self._waiting_s,
            busy_waiting_gpu_s=self._busy_waiting_gpu_s,
            usable_idle_gpu_s=self._usable_idle_gpu_s,
            running_job_s=self._running_job_s,
        )
