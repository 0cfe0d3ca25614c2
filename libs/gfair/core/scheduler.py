"""The `GandivaFair` facade: a stateful driver of the decision kernel (docs/design.md §2.7).

It keeps what the kernel's snapshots are made of as jobs come, go and are profiled, and turns
each quantum into `kernel.decide` on that snapshot, then `kernel.settle`:

- `submit` admits a job, or rejects it with the reason of the admission filter that refused
  every pool (`placement.filter_pools`: its type fits no generation, or its gang is larger than
  every generation). An admitted job is not tied to a pool; the kernel places it each quantum.
- Entitlements: the cluster's GPUs are water-filled among active users by tickets and demand
  (down the accounts of `SchedulerConfig.shares`, when given) and
  held as the same fraction of every pool (`pools.entitlements`); with trading on, users then
  trade share between pools (`trading.trade`) using their estimated speeds. Both are recomputed
  when the set of active jobs or a user's speeds change, and, in the shares tree's decayed mode,
  at every plan: each user's GPUs held by the jobs placed (and backfilled) are charged into a
  `usage_decay.DecayedUsage` up to every plan, backfill and job end, and the water-fill weighs
  that usage (`ShareTree.fill`). Plans then never count as settled: usage moves every quantum.
- Job arrays' limits (`arrays`): the snapshot leaves out an array's members beyond its limit,
  and the user's demand does not count what they ask beyond it.
- Speeds come from the `ThroughputEstimator` (defaults, the Gavel seed, then observations); a
  job's speed on a generation whose measured throughput is zero is 0 (it never goes there).
"""

from __future__ import annotations

import bisect
import operator
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from gfair.core import accounts, arrays
from gfair.core.cluster import Cluster, generation_rank
from gfair.core.kernel import (
    Decision,
    JobState,
    PoolState,
    Snapshot,
    UserState,
    backfill,
    decide,
    settle,
)
from gfair.core.placement import PoolView, filter_pools, rejection_reason
from gfair.core.pools import Pool, pools_of, shares
from gfair.core.shares_tree import ShareTree
from gfair.core.switch_costs import DEFAULT_COSTS, SwitchCosts
from gfair.core.throughput import ThroughputEstimator, ThroughputTable
from gfair.core.tickets import check_tickets
from gfair.core.trading import Trade
from gfair.core.usage_decay import DecayedUsage


@dataclass(frozen=True)
class JobSpec:
    id: str
    user: str
    gpus: int
    job_type: str | None = None  # a key of the throughput table, or None (unknown type)
    weight: float = 1.0  # its part of its user's share, relative to the user's other jobs
    array: str | None = None  # its job array's id (the user's), if it belongs to one
    array_limit: int | None = None  # at most this many of the array run at once
    costs: SwitchCosts = DEFAULT_COSTS  # what a resume and a move cost it


@dataclass(frozen=True)
class Migration:
    job_id: str
    from_servers: tuple[str, ...]
    to_servers: tuple[str, ...]
    cause: str = ""  # "pool" (across generations) or "server" (within one)


@dataclass(frozen=True)
class Admission:
    accepted: bool
    reason: str = ""  # why rejected, or which pools the job can use
    pool: str | None = None  # the fastest pool the job can use
    servers: tuple[str, ...] = ()
    rule: str = ""  # the placement filter that refused, when rejected


@dataclass(frozen=True)
class QuantumPlan:
    runs: Mapping[str, tuple[str, ...]]  # server id -> jobs holding GPUs on it this quantum
    placements: Mapping[str, tuple[str, ...]]  # job id -> servers, for every job that runs
    migrations: tuple[Migration, ...]  # jobs resuming or running on other servers than before
    trades: tuple[Trade, ...]  # trades in force after this plan
    waiting: int = 0  # runnable jobs that do not run this quantum


@dataclass(frozen=True)
class SchedulerConfig:
    trading: bool = True
    min_seller_gain: float = 0.10
    throughput_alpha: float = 0.3
    quantum_s: float = 60.0  # what the kernel weighs a move's cost against
    shares: ShareTree | None = None  # accounts above the users; None: flat tickets

    def __post_init__(self) -> None:
        if self.min_seller_gain < 0:
            raise ValueError(f"min_seller_gain must be >= 0, got {self.min_seller_gain}")
        if not 0 < self.throughput_alpha <= 1:
            raise ValueError(f"throughput_alpha must be in (0, 1], got {self.throughput_alpha}")


# A job's place in its user's queue: (pass, arrival), unique (arrivals are).
_queue_key: Callable[[JobState], tuple[float, int]] = operator.attrgetter("pass_", "seq")


@dataclass
class _User:
    tickets: float
    state: UserState
    jobs: dict[str, JobState] = field(default_factory=dict)  # in arrival order
    queue: list[JobState] = field(default_factory=list)  # sorted by `_queue_key`
    sizes: Counter[int] = field(default_factory=Counter)  # gang size -> jobs
    gangs: Counter[tuple[str | None, int]] = field(default_factory=Counter)  # -> GPUs asked
    demand: int = 0
    members: dict[str, tuple[int, arrays.ArrayMember]] = field(default_factory=dict)
    speeds: dict[str, float] | None = None  # cached speed profile; None when stale
    # (job type, GPUs) -> the speeds its jobs without observations of their own share: one
    # update reaches them all (an observation of one job refines its type's for the user).
    type_speeds: dict[tuple[str | None, int], dict[str, float]] = field(default_factory=dict)


class GandivaFair:
    def __init__(
        self,
        cluster: Cluster,
        tickets: Mapping[str, float],
        throughput: ThroughputTable,
        config: SchedulerConfig | None = None,
        default_tickets: float = 1.0,
    ) -> None:
        self.cluster = cluster
        self.config = config or SchedulerConfig()
        self.pools: dict[str, Pool] = pools_of(cluster)
        fastest_first = sorted(self.pools, key=generation_rank, reverse=True)
        self._pool_states = tuple(
            PoolState(g, self.pools[g].servers, rank) for rank, g in enumerate(fastest_first)
        )
        self.estimator = ThroughputEstimator(throughput, alpha=self.config.throughput_alpha)
        self._tickets = dict(tickets)
        self._default_tickets = default_tickets
        self._jobs: dict[str, JobSpec] = {}
        self._states: dict[str, JobState] = {}
        self._users: dict[str, _User] = {}
        self._seq = 0
        self._trades: tuple[Trade, ...] = ()
        self._shares_dirty = False
        self._profiled = False  # a job was profiled since the last plan: its speeds may differ
        self._last: Decision | None = None
        # Jobs placed by the last plan (and backfilled since), in the order they were: a dict,
        # not a set, so that nothing decided from it depends on the process's string hashing.
        self._running: dict[str, None] = {}
        self._members: dict[str, arrays.ArrayMember] = {}  # job id -> its array, if any
        self._server_pool = {s.id: s.generation for s in cluster.servers}
        self._gpus = {g: pool.gpus for g, pool in self.pools.items()}
        tree = self.config.shares
        # The decayed mode's usage, charged up to `_charged_at` (None before the first charge).
        self._usage: DecayedUsage | None = None
        if tree is not None and tree.decayed and tree.half_life_s is not None:
            self._usage = DecayedUsage(tree.half_life_s)
        self._charged_at: float | None = None

    # -- the facade ---------------------------------------------------------------------

    def submit(self, job: JobSpec, now: float) -> Admission:
        if job.id in self._jobs:
            return Admission(False, f"job {job.id} is already submitted")
        if job.gpus < 1:
            return Admission(False, f"job {job.id}: gpus must be >= 1, got {job.gpus}")
        try:
            check_tickets(f"job {job.id}: weight", job.weight)
        except ValueError as error:
            return Admission(False, str(error))
        user = self._user(job.user)
        speeds = user.type_speeds.get((job.job_type, job.gpus)) or self._job_speeds(job)
        type_speeds = self.estimator.job_speeds(job.id, job.user, job.job_type, self.pools)
        views = [
            PoolView(pool, type_speeds[g] if self.estimator.fits(job.job_type, g) else 0.0)
            for g, pool in self.pools.items()
        ]
        admitted = filter_pools(job.gpus, job.job_type, views)
        usable = admitted.usable
        if not admitted.accepted:
            if not user.jobs:
                del self._users[job.user]
            reason = rejection_reason(job.gpus, views, admitted.rejections)
            return Admission(False, reason, rule=admitted.rule)
        user.type_speeds.setdefault((job.job_type, job.gpus), speeds)
        self._seq += 1
        joins = accounts.joining_pass(j.pass_ for j in user.queue[:1])  # the queue is sorted
        state = JobState(
            job.id,
            job.user,
            job.gpus,
            self._seq,
            speeds,
            joins,
            job.weight,
            move_s=job.costs.migration_s,
            resume_s=job.costs.resume_s,
        )
        self._jobs[job.id] = job
        self._states[job.id] = state
        user.jobs[job.id] = state
        bisect.insort(user.queue, state, key=_queue_key)
        user.sizes[job.gpus] += 1
        user.demand += job.gpus
        if job.array is not None:
            member = arrays.ArrayMember(arrays.array_key(job.user, job.array), job.array_limit)
            self._members[job.id] = member
            user.members[job.id] = (job.gpus, member)
        user.gangs[(job.job_type, job.gpus)] += job.gpus
        user.speeds = None
        self._shares_dirty = True
        fastest = max(usable, key=lambda g: (speeds[g], generation_rank(g)))
        return Admission(True, f"can run on {', '.join(sorted(usable))}", fastest)

    def finish(self, job_id: str, now: float) -> None:
        if job_id not in self._jobs:
            raise KeyError(f"unknown job {job_id!r}")
        self._charge(now)  # what it held up to now, before it lets go
        spec = self._jobs.pop(job_id)
        state = self._states.pop(job_id)
        self._running.pop(job_id, None)
        self.estimator.forget_job(job_id)
        user = self._users[spec.user]
        del user.jobs[job_id]
        del user.queue[bisect.bisect_left(user.queue, _queue_key(state), key=_queue_key)]
        user.sizes[spec.gpus] -= 1
        if not user.sizes[spec.gpus]:
            del user.sizes[spec.gpus]
        gang = (spec.job_type, spec.gpus)
        user.gangs[gang] -= spec.gpus
        if user.gangs[gang] == 0:
            del user.gangs[gang]
        user.demand -= spec.gpus
        user.members.pop(job_id, None)
        self._members.pop(job_id, None)
        user.speeds = None
        if user.demand == 0:
            del self._users[spec.user]
        self._shares_dirty = True

    def observe(self, job_id: str, generation: str, rate: float, now: float) -> None:
        spec = self._jobs[job_id]
        self.estimator.observe(job_id, spec.user, spec.job_type, generation, rate)
        user = self._users[spec.user]
        self._states[job_id].speeds = self._job_speeds(spec)
        for (job_type, gpus), shared in user.type_speeds.items():
            if job_type == spec.job_type:
                shared.update(self._job_speeds(JobSpec("", spec.user, gpus, job_type)))
        self._profiled = True
        # Shares depend on speeds only through trading, and on the user's speed profile only:
        # an observation that confirms it (the common case) leaves them as they are.
        before, user.speeds = user.speeds, None
        if self.config.trading and (
            before is None or self._user_speeds(spec.user, tuple(self.pools)) != before
        ):
            self._shares_dirty = True

    def plan(self, now: float) -> QuantumPlan:
        if self._usage is not None:
            self._charge(now)
            self._shares_dirty = True  # the usage moved: the weights with it
        if self._shares_dirty:
            self._refresh_shares()
        self._profiled = False
        snapshot = self.snapshot()
        decision = decide(snapshot)
        ran = [self._states[job_id] for job_id in decision.placed]
        # Passes change: the jobs that ran take their new places. A user's queue is sorted
        # again when that is cheaper than taking its jobs that ran out and putting them back,
        # one bisection each (many of a short queue ran); keys are unique, so the order is
        # the same either way.
        resort: list[list[JobState]] = []
        moved: list[JobState] = []
        if decision.waiting:
            by_user: dict[str, list[JobState]] = {}
            for job in ran:
                by_user.setdefault(job.user, []).append(job)
            for name, jobs in by_user.items():
                queue = self._users[name].queue
                if 2 * len(jobs) * len(queue).bit_length() > len(queue):
                    resort.append(queue)
                    continue
                for job in jobs:
                    del queue[bisect.bisect_left(queue, _queue_key(job), key=_queue_key)]
                moved.extend(jobs)
        ceiling = {name: accounts.ceiling(user.sizes) for name, user in self._users.items()}
        if settle(snapshot.users, ran, decision, ceiling, snapshot.overrun, snapshot.unheld):
            for queue in resort:
                queue.sort(key=_queue_key)
            for job in moved:
                bisect.insort(self._users[job.user].queue, job, key=_queue_key)
        migrations = self._carry_out(decision)
        self._last = decision
        return QuantumPlan(
            runs=MappingProxyType(decision.runs),
            placements=MappingProxyType(decision.placed),
            migrations=migrations,
            trades=self._trades,
            waiting=decision.waiting,
        )

    def backfill(self, now: float) -> dict[str, tuple[str, ...]]:
        """Jobs to start now on GPUs left idle since the last plan (`kernel.backfill`): job id
        -> servers. They count as running from now on; the next plan decides them as such."""
        if self._last is None or len(self._states) <= len(self._running):
            return {}  # before the first plan, or nothing waits
        # Shares as of the last plan: they only order the waiting users here, and the next
        # plan refreshes them (trading again at every arrival and end would cost more).
        holding = [self._states[job_id] for job_id in self._running]
        started = backfill(self.snapshot(), holding)
        if started:
            self._charge(now)  # the GPUs held so far, before the new jobs hold theirs
        for job_id, servers in started.items():
            state = self._states[job_id]
            state.home = state.running = servers
        self._running.update(dict.fromkeys(started))
        return started

    def snapshot(self) -> Snapshot:
        """What the kernel decides the next quantum from (shares as last refreshed)."""
        queues: Mapping[str, Sequence[JobState]] = {
            name: user.queue for name, user in self._users.items()
        }
        if self._members:
            queues = arrays.limit_arrays(queues, self._members)
        return Snapshot(
            self._pool_states,
            {name: user.state for name, user in self._users.items()},
            queues,
            quantum_s=self.config.quantum_s,
        )

    def settled(self) -> bool:
        """Whether the next plan would repeat the last one until a job arrives, finishes or is
        profiled: every runnable job ran (nothing was booked) and nothing changed since."""
        return (
            self._last is not None
            and self._last.waiting == 0
            and not (self._shares_dirty or self._profiled)
            and self._usage is None
        )

    def entitlements(self) -> Mapping[str, Mapping[str, float]]:
        if self._shares_dirty:
            self._refresh_shares()
        return MappingProxyType(
            {n: MappingProxyType(dict(u.state.entitled)) for n, u in self._users.items()}
        )

    # -- read-only views for drivers and tests ------------------------------------------

    def placement(self, job_id: str) -> tuple[str, ...]:
        """The servers the job ran on in the last quantum (empty when it waited)."""
        return self._states[job_id].running

    def job_speeds(self, job_id: str) -> Mapping[str, float]:
        return MappingProxyType(self._states[job_id].speeds)

    def user_tickets(self, user: str) -> float:
        flat = self._tickets.get(user, self._default_tickets)
        return flat if self.config.shares is None else self.config.shares.tickets_of(user, flat)

    def credit(self, user: str) -> Mapping[str, float]:
        return MappingProxyType(dict(self._users[user].state.credit))

    def usage(self) -> Mapping[str, float]:
        """User -> decayed GPU-seconds as of the last plan, backfill or job end (decayed mode;
        empty otherwise)."""
        return MappingProxyType(self._usage.usage() if self._usage is not None else {})

    # -- internals ----------------------------------------------------------------------

    def _user(self, name: str) -> _User:
        if name not in self._users:
            tickets = check_tickets(f"user {name}", self.user_tickets(name))
            self._seq += 1
            self._users[name] = _User(tickets, UserState(name, self._seq))
        return self._users[name]

    def _carry_out(self, decision: Decision) -> tuple[Migration, ...]:
        migrations: list[Migration] = []
        for job_id in self._running:
            if job_id not in decision.placed:
                self._states[job_id].running = ()
        for job_id, servers in decision.placed.items():
            state = self._states[job_id]
            before = state.running or state.home
            if before and before != servers:
                across = self._server_pool[before[0]] != self._server_pool[servers[0]]
                cause = "pool" if across else "server"
                migrations.append(Migration(job_id, before, servers, cause))
            state.home = state.running = servers
        self._running = dict.fromkeys(decision.placed)
        return tuple(migrations)

    def _charge(self, now: float) -> None:
        """Decayed mode: charge each user the GPUs its placed and backfilled jobs held from the
        last charge to `now`."""
        if self._usage is None:
            return
        since, self._charged_at = self._charged_at, now
        if since is None or now <= since:
            return
        held: dict[str, int] = {}
        for job_id in self._running:
            state = self._states[job_id]
            held[state.user] = held.get(state.user, 0) + state.gpus
        self._usage.advance(now)
        for user, gpus in held.items():
            self._usage.charge(user, gpus, now - since)

    def _refresh_shares(self) -> None:
        self._shares_dirty = False
        names = sorted(self._users)
        generations = tuple(self.pools)
        result = shares(
            {g: pool.gpus for g, pool in self.pools.items()},
            {u: self._users[u].tickets for u in names},
            {u: self._demand(self._users[u]) for u in names},
            {u: self._user_speeds(u, generations) for u in names} if self.config.trading else None,
            min_seller_gain=self.config.min_seller_gain,
            tree=self.config.shares,
            usage=self._usage.usage() if self._usage is not None else None,
        )
        self._trades = result.trades
        accounts.entitle([self._users[name].state for name in names], result.entitled, self.pools)

    @staticmethod
    def _demand(user: _User) -> int:
        if not user.members:
            return user.demand
        return user.demand - arrays.excess_demand(user.members.values())

    def _user_speeds(self, name: str, generations: tuple[str, ...]) -> dict[str, float]:
        user = self._users[name]
        if user.speeds is None:
            pool_gpus = {g: self.pools[g].gpus for g in generations}
            user.speeds = self.estimator.user_speeds(name, user.gangs, pool_gpus)
        return user.speeds

    def _job_speeds(self, job: JobSpec) -> dict[str, float]:
        """The job's speed per generation; 0 where its type or its gang does not fit."""
        return self.estimator.gang_speeds(job.id, job.user, job.job_type, job.gpus, self._gpus)
