"""The `GandivaFair` facade: the core's pieces composed into a quantum-by-quantum scheduler.

This is what the trace simulator drives; the live services call the pieces themselves.

- `submit` admits a job (or rejects it with the reason of the rule that refused it) and places
  it at once: pool by `placement.choose_pool`, servers by least ticket load.
- `plan` makes one quantum's decision: refresh shares if anything changed, re-derive each job's
  stride tickets, decide a bounded number of migrations, then run split stride.
- Entitlements: the cluster's GPUs are water-filled among active users by tickets and demand and
  held as the same fraction of every pool (`pools.entitlements`); with trading on, users then
  trade share between pools (`trading.trade`) using their estimated speeds.
- Stride tickets realise the entitlements: in pool P a job of user U holds
  ``entitled[U][P] / (U's jobs in P)`` tickets (in GPUs of share), so U's jobs in P together get
  U's share of P. A job in a pool where its user holds no share (placed on idle capacity) holds
  `SchedulerConfig.surplus_weight` times its user's average: it runs on what others leave idle.
- Migrations, at most `migration_budget` per plan: first across pools (a user with unused
  entitlement in a pool gets a job moved in, if the job is faster there or its old pool is
  oversubscribed, i.e. asks more GPUs than it has, with the user over its entitlement there: a
  job on idle capacity stays until the pool's own users want it back), then within each pool
  (`balance.propose_migrations`). They are only looked for when something changed since the
  last search that used its whole budget.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gfair.core.balance import Resident, propose_migrations, spread
from gfair.core.cluster import Cluster
from gfair.core.placement import PoolView, choose_pool, choose_servers, filter_pool
from gfair.core.pools import Pool, entitlements, pools_of
from gfair.core.split_stride import SplitStride
from gfair.core.throughput import ThroughputEstimator, ThroughputTable
from gfair.core.trading import Trade, trade

_EPS = 1e-9


@dataclass(frozen=True)
class JobSpec:
    id: str
    user: str
    gpus: int
    job_type: str | None = None  # a key of the throughput table, or None (unknown type)


@dataclass(frozen=True)
class Migration:
    job_id: str
    from_servers: tuple[str, ...]
    to_servers: tuple[str, ...]
    cause: str = ""  # "pool" (across generations) or "balance" (within one)


@dataclass(frozen=True)
class Admission:
    accepted: bool
    reason: str = ""  # why rejected, or how the pool was chosen
    pool: str | None = None
    servers: tuple[str, ...] = ()
    rule: str = ""  # the placement rule that decided (see placement.py)


@dataclass(frozen=True)
class QuantumPlan:
    runs: Mapping[str, tuple[str, ...]]  # server id -> jobs holding GPUs on it this quantum
    placements: Mapping[str, tuple[str, ...]]  # job id -> servers, for every placed job
    migrations: tuple[Migration, ...]  # decided in this plan (placements already reflect them)
    trades: tuple[Trade, ...]  # trades in force after this plan


@dataclass(frozen=True)
class SchedulerConfig:
    trading: bool = True
    min_seller_gain: float = 0.10
    # Relative spread of ticket load, (max - min) / mean, tolerated among a pool's servers
    # before jobs move: with 16 one-GPU jobs per 8-GPU server, 0.25 is two jobs' difference.
    balance_threshold: float = 0.25
    migration_budget: int = 4  # per plan, across-pool and within-pool moves together
    pool_migrations: bool = True
    surplus_weight: float = 1e-3
    throughput_alpha: float = 0.3

    def __post_init__(self) -> None:
        if self.min_seller_gain < 0:
            raise ValueError(f"min_seller_gain must be >= 0, got {self.min_seller_gain}")
        if self.balance_threshold < 0:
            raise ValueError(f"balance_threshold must be >= 0, got {self.balance_threshold}")
        if self.migration_budget < 0:
            raise ValueError(f"migration_budget must be >= 0, got {self.migration_budget}")
        if not 0 < self.surplus_weight < 1:
            raise ValueError(f"surplus_weight must be in (0, 1), got {self.surplus_weight}")


@dataclass
class _Job:
    spec: JobSpec
    pool: str
    submitted: float
    tickets: float  # its stride tickets, as last given to split stride


@dataclass
class _User:
    tickets: float
    jobs: dict[str, dict[str, None]] = field(default_factory=dict)  # pool -> job ids
    used: Counter[str] = field(default_factory=Counter)  # pool -> GPUs its placed jobs ask
    type_gpus: Counter[str | None] = field(default_factory=Counter)
    demand: int = 0
    speeds: dict[str, float] | None = None  # cached speed profile; None when stale


class GandivaFair:
    def __init__(
        self,
        cluster: Cluster,
        tickets: Mapping[str, float],
        throughput: ThroughputTable,
        config: SchedulerConfig = SchedulerConfig(),
        default_tickets: float = 1.0,
    ) -> None:
        for user, value in tickets.items():
            if not value > 0:
                raise ValueError(f"user {user}: tickets must be > 0, got {value}")
        if not default_tickets > 0:
            raise ValueError(f"default_tickets must be > 0, got {default_tickets}")
        self.cluster = cluster
        self.config = config
        self.pools: dict[str, Pool] = pools_of(cluster)
        self.estimator = ThroughputEstimator(throughput, alpha=config.throughput_alpha)
        self._tickets = dict(tickets)
        self._default_tickets = default_tickets
        self._stride = SplitStride(cluster)
        self._jobs: dict[str, _Job] = {}
        self._users: dict[str, _User] = {}
        self._pool_demand: Counter[str] = Counter()
        self._entitled: dict[str, dict[str, float]] = {}
        self._trades: tuple[Trade, ...] = ()
        self._shares_dirty = False
        self._tickets_dirty = False
        self._moves_dirty = False

    # -- the facade ---------------------------------------------------------------------

    def submit(self, job: JobSpec, now: float) -> Admission:
        if job.id in self._jobs:
            return Admission(False, f"job {job.id} is already submitted")
        if job.gpus < 1:
            return Admission(False, f"job {job.id}: gpus must be >= 1, got {job.gpus}")
        speeds = self._job_speeds(job)
        views = [self._view(job, pool, speeds, 0.0) for pool in self.pools.values()]
        if not any(filter_pool(job.gpus, v, job.job_type) is None for v in views):
            return Admission(False, choose_pool(job.gpus, job.job_type, views).reason)
        user = self._user(job.user)
        user.demand += job.gpus
        user.type_gpus[job.job_type] += job.gpus
        user.speeds = None
        self._refresh_shares()
        entitled = self._entitled.get(job.user, {})
        views = [
            self._view(job, pool, speeds, entitled.get(pool.generation, 0.0), free_fit=True)
            for pool in self.pools.values()
        ]
        choice = choose_pool(job.gpus, job.job_type, views)
        assert choice.pool is not None  # a pool passed the filters above
        pool = self.pools[choice.pool]
        servers = self._servers_for(pool, job, job.user)
        tickets = self._estimated_tickets(job.user, pool)
        self._stride.add(job.id, servers, job.gpus, tickets)
        self._jobs[job.id] = _Job(job, pool.generation, now, tickets)
        user.jobs.setdefault(pool.generation, {})[job.id] = None
        user.used[pool.generation] += job.gpus
        self._pool_demand[pool.generation] += job.gpus
        self._tickets_dirty = self._moves_dirty = True
        return Admission(True, choice.reason, pool.generation, servers, choice.rule)

    def finish(self, job_id: str, now: float) -> None:
        try:
            job = self._jobs.pop(job_id)
        except KeyError:
            raise KeyError(f"unknown job {job_id!r}") from None
        self._stride.remove(job_id)
        self.estimator.forget_job(job_id)
        spec, user = job.spec, self._users[job.spec.user]
        del user.jobs[job.pool][job_id]
        user.used[job.pool] -= spec.gpus
        user.type_gpus[spec.job_type] -= spec.gpus
        if user.type_gpus[spec.job_type] == 0:
            del user.type_gpus[spec.job_type]
        user.demand -= spec.gpus
        user.speeds = None
        self._pool_demand[job.pool] -= spec.gpus
        if user.demand == 0:
            del self._users[spec.user]
        self._shares_dirty = self._tickets_dirty = self._moves_dirty = True

    def observe(self, job_id: str, generation: str, rate: float, now: float) -> None:
        spec = self._jobs[job_id].spec
        self.estimator.observe(job_id, spec.user, spec.job_type, generation, rate)
        self._users[spec.user].speeds = None
        if self.config.trading:
            self._shares_dirty = True

    def plan(self, now: float) -> QuantumPlan:
        if self._shares_dirty:
            self._refresh_shares()
        if self._tickets_dirty:
            self._retick()
        migrations: list[Migration] = []
        if self._moves_dirty:
            budget = self.config.migration_budget
            if self.config.pool_migrations:
                self._pool_moves(budget, migrations)
            for pool in self.pools.values():
                self._balance_moves(pool, budget - len(migrations), migrations)
            self._moves_dirty = len(migrations) >= budget > 0
            if self._tickets_dirty:  # a job changed pools
                self._retick()
        runs = self._stride.schedule()
        return QuantumPlan(
            runs=MappingProxyType(runs),
            placements=MappingProxyType(dict(self._stride.placements())),
            migrations=tuple(migrations),
            trades=self._trades,
        )

    def entitlements(self) -> Mapping[str, Mapping[str, float]]:
        if self._shares_dirty:
            self._refresh_shares()
        return MappingProxyType({u: MappingProxyType(dict(e)) for u, e in self._entitled.items()})

    # -- read-only views for drivers and tests ------------------------------------------

    def placement(self, job_id: str) -> tuple[str, ...]:
        return self._stride.placement(job_id)

    def pool_of(self, job_id: str) -> str:
        return self._jobs[job_id].pool

    def stride_tickets(self, job_id: str) -> float:
        return self._stride.tickets(job_id)

    def user_tickets(self, user: str) -> float:
        return self._tickets.get(user, self._default_tickets)

    # -- shares and tickets -------------------------------------------------------------

    def _user(self, name: str) -> _User:
        if name not in self._users:
            self._users[name] = _User(self.user_tickets(name))
        return self._users[name]

    def _refresh_shares(self) -> None:
        self._shares_dirty = False
        pool_gpus = {g: pool.gpus for g, pool in self.pools.items()}
        names = sorted(self._users)
        shares = entitlements(
            pool_gpus,
            {u: self._users[u].tickets for u in names},
            {u: self._users[u].demand for u in names},
        )
        trades: tuple[Trade, ...] = ()
        if self.config.trading and len(self.pools) > 1 and len(names) > 1:
            generations = tuple(self.pools)
            speeds = {u: self._user_speeds(u, generations) for u in names}
            result = trade(
                shares,
                speeds,
                generations,
                min_seller_gain=self.config.min_seller_gain,
                demands={u: self._users[u].demand for u in names},
            )
            shares, trades = result.holdings, result.trades
        self._trades = trades
        if shares != self._entitled:
            self._entitled = shares
            self._tickets_dirty = self._moves_dirty = True

    def _user_speeds(self, name: str, generations: tuple[str, ...]) -> dict[str, float]:
        user = self._users[name]
        if user.speeds is None:
            user.speeds = self.estimator.user_speeds(name, user.type_gpus, generations)
        return user.speeds

    def _estimated_tickets(self, user_name: str, pool: Pool) -> float:
        """Stride tickets of one job of `user_name` in `pool` (see module doc)."""
        user = self._users[user_name]
        entitled = self._entitled.get(user_name, {})
        share = entitled.get(pool.generation, 0.0)
        count = len(user.jobs.get(pool.generation, ())) or 1
        if share > _EPS:
            return share / count
        total_jobs = sum(len(jobs) for jobs in user.jobs.values()) or 1
        average = sum(entitled.values()) / total_jobs
        return self.config.surplus_weight * (average if average > _EPS else 1.0)

    def _retick(self) -> None:
        self._tickets_dirty = False
        changes: dict[str, float] = {}
        for name, user in self._users.items():
            for generation, jobs in user.jobs.items():
                if not jobs:
                    continue
                tickets = self._estimated_tickets(name, self.pools[generation])
                for job_id in jobs:
                    job = self._jobs[job_id]
                    if job.tickets != tickets:
                        job.tickets = tickets
                        changes[job_id] = tickets
        if changes:
            self._stride.set_many(changes)

    # -- placement and migrations -------------------------------------------------------

    def _job_speeds(
        self, job: JobSpec, by_type: dict[str | None, dict[str, float]] | None = None
    ) -> dict[str, float]:
        """The job's speed per generation (0 where its type does not fit).

        `by_type` caches the speeds of one user's jobs that have no observations of their own
        (those differ only by type).
        """
        shared = by_type is not None and not self.estimator.observed(job.id)
        if shared and by_type is not None and job.job_type in by_type:
            return by_type[job.job_type]
        speeds = self.estimator.job_speeds(job.id, job.user, job.job_type, self.pools)
        speeds = {
            g: (v if self.estimator.fits(job.job_type, g) else 0.0) for g, v in speeds.items()
        }
        if shared and by_type is not None:
            by_type[job.job_type] = speeds
        return speeds

    def _view(
        self,
        job: JobSpec,
        pool: Pool,
        speeds: Mapping[str, float],
        entitled: float,
        free_fit: bool = False,
    ) -> PoolView:
        """What placement sees of `pool` for `job`; with `free_fit`, also whether the job's
        GPUs are free there as `choose_servers` would take them."""
        used = self._users[job.user].used[pool.generation] if job.user in self._users else 0
        demand = self._pool_demand[pool.generation]
        fits: bool | None = None
        if free_fit and demand + job.gpus <= pool.gpus:
            asked = self._stride.asked()
            if job.gpus <= pool.largest_server:
                fits = any(s.gpus - asked[s.id] >= job.gpus for s in pool.servers)
            else:
                fits = sum(s.gpus for s in pool.servers if not asked[s.id]) >= job.gpus
        return PoolView(pool, speeds[pool.generation], entitled, used, demand, fits)

    def _servers_for(self, pool: Pool, job: JobSpec, user: str) -> tuple[str, ...]:
        return choose_servers(
            pool,
            job.gpus,
            self._estimated_tickets(user, pool),
            self._stride.loads(),
            self._stride.asked(),
        )

    def _move(self, job_id: str, pool: Pool, servers: tuple[str, ...], cause: str) -> Migration:
        job = self._jobs[job_id]
        spec, user = job.spec, self._users[job.spec.user]
        before = self._stride.placement(job_id)
        self._stride.move(job_id, servers, spec.gpus)
        if pool.generation != job.pool:
            del user.jobs[job.pool][job_id]
            user.jobs.setdefault(pool.generation, {})[job_id] = None
            user.used[job.pool] -= spec.gpus
            user.used[pool.generation] += spec.gpus
            self._pool_demand[job.pool] -= spec.gpus
            self._pool_demand[pool.generation] += spec.gpus
            job.pool = pool.generation
            self._tickets_dirty = True
        return Migration(job_id, before, servers, cause)

    def _pool_moves(self, budget: int, migrations: list[Migration]) -> None:
        """Move jobs into pools where their user has unused entitlement (module doc).

        One move per user and target pool per round, rounds until the budget is spent or a
        round moves nothing.
        """
        moved = True
        while moved and len(migrations) < budget:
            moved = False
            for name in sorted(self._users):
                for target in self.pools.values():
                    if len(migrations) >= budget:
                        return
                    job_id = self._pool_move_candidate(name, target)
                    if job_id is None:
                        continue
                    servers = self._servers_for(target, self._jobs[job_id].spec, name)
                    if servers:
                        migrations.append(self._move(job_id, target, servers, "pool"))
                        moved = True
                if len(migrations) < budget and self._evict_one(name, migrations):
                    moved = True

    def _evict_one(self, name: str, migrations: list[Migration]) -> bool:
        """Move one job of `name` out of an oversubscribed pool where it holds no share.

        Such a job got there on idle capacity (the `surplus` rule); once the pool's own users
        ask for all of it, it only crowds their jobs, so it goes to the pool where its user is
        least oversubscribed. It never comes back: pool moves only go where there is room.
        """
        user, entitled = self._users[name], self._entitled.get(name, {})
        for source, jobs in user.jobs.items():
            pool = self.pools[source]
            if (
                not jobs
                or entitled.get(source, 0.0) > _EPS
                or self._pool_demand[source] <= pool.gpus
            ):
                continue
            job_id = next(iter(jobs))
            spec = self._jobs[job_id].spec
            speeds = self._job_speeds(spec)
            homes = [
                p
                for g, p in self.pools.items()
                if entitled.get(g, 0.0) > _EPS and speeds[g] > 0 and spec.gpus <= p.gpus
            ]
            if not homes:
                continue
            home = min(
                homes,
                key=lambda p: (
                    (user.used[p.generation] + spec.gpus) / entitled[p.generation],
                    -speeds[p.generation],
                ),
            )
            servers = self._servers_for(home, spec, name)
            if servers:
                migrations.append(self._move(job_id, home, servers, "pool"))
                return True
        return False

    def _pool_move_candidate(self, name: str, target: Pool) -> str | None:
        """The job of `name` gaining most from moving into `target`, if any may move there."""
        user, entitled = self._users[name], self._entitled.get(name, {})
        room = entitled.get(target.generation, 0.0) - user.used[target.generation]
        if room < 1 - _EPS:
            return None
        best: tuple[float, str] | None = None
        by_type: dict[str | None, dict[str, float]] = {}
        for source, jobs in user.jobs.items():
            if source == target.generation:
                continue
            # Being over one's entitlement in a pool only costs others when the pool is
            # oversubscribed; otherwise the job sits on idle capacity (placement's surplus
            # rule) and moving it to a slower pool would gain nobody anything.
            over = (
                user.used[source] - entitled.get(source, 0.0)
                if self._pool_demand[source] > self.pools[source].gpus
                else 0.0
            )
            for job_id in jobs:
                spec = self._jobs[job_id].spec
                if spec.gpus > room + _EPS or spec.gpus > target.gpus:
                    continue
                speeds = self._job_speeds(spec, by_type)
                if speeds[target.generation] <= 0:
                    continue
                gain = (
                    speeds[target.generation] / speeds[source]
                    if speeds[source] > 0
                    else float("inf")
                )
                if gain <= 1 and over < spec.gpus - _EPS:
                    continue  # slower there, and its own pool is not oversubscribed
                if best is None or gain > best[0]:
                    best = (gain, job_id)
        return None if best is None else best[1]

    def _balance_moves(self, pool: Pool, budget: int, migrations: list[Migration]) -> None:
        if budget <= 0 or len(pool.servers) < 2:
            return
        loads, asked = self._stride.loads(), self._stride.asked()
        crowded = any(asked[s.id] > s.gpus for s in pool.servers)
        roomy = any(asked[s.id] < s.gpus for s in pool.servers)
        if spread(pool.servers, loads) <= self.config.balance_threshold and not (crowded and roomy):
            return
        for move in propose_migrations(
            pool.servers, loads, self._residents, self.config.balance_threshold, budget, asked
        ):
            migrations.append(self._move(move.job_id, pool, (move.to_server,), "balance"))

    def _residents(self, server_id: str) -> list[Resident]:
        queue = self._stride.local_queue(server_id)
        residents = [
            Resident(job_id, queue.entry(job_id).gpus, queue.entry(job_id).tickets)
            for job_id in queue.job_ids()
        ]
        multi = self._stride.loads()[server_id] - queue.tickets
        if multi > 0:
            # Multi-server jobs weigh on the server but only move with their whole gang.
            residents.append(Resident(f"multi@{server_id}", queue.gpus, multi, movable=False))
        return residents
