"""The `gandiva-fair` policy: the live service's state machine
(`gfair.core.scheduler.SplitStride`), driven with virtual time.

The simulator plays the services around the machine with the core functions they use, and
decides nothing itself:

- placement: a job is admitted unless the admission filters refuse every pool
  (`placement.filter_pools`), then `Admitted`, with the job's switch costs;
- the trading auction: the users' per-pool shares (`pools.shares`: water-fill by tickets and
  demand, then trades bid with the profiled speeds), published as `EntitlementsPublished`
  before a quantum when jobs arrived or ended or the bids changed since the last
  (in the shares tree's decayed mode before every quantum, weighing the users' decayed use of
  what they held);
- the profiler: every measured rate folds into its estimator, and the user's rates of the job
  type, on the generations measured, go out as `TypeProfiled`;
- the nodes: every command is carried out and confirmed at once, in command order, in one
  input (`CarriedOut`: what the stops' reports, `Suspended` or `Migrated` when the job moves,
  handed in together, then the starts' `Started` would say); what the releases let start (idle
  GPUs filled) is carried out in turn. Since they let go at once, the machine is told so
  (`SchedulerConfig.moves_at_once`): a job a quantum moves starts in the quantum's own plan,
  after the stops, not once per release report.

Jobs the machine starts between ticks (an arrival or an end filled idle GPUs) are what `fill`
hands the simulator; each quantum's `runs` are where jobs hold GPUs once its plan is carried out.
Switch costs are the simulator's to charge, as for every policy.

The simulator and the split-stride service drive this one machine: a scheduling rule lives in
it (and the core functions it calls), never in a driver (docs/design.md §2.7).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

from gfair.core import accounts, arrays
from gfair.core.cluster import Cluster, generation_rank
from gfair.core.placement import PoolView, filter_pools, rejection_reason
from gfair.core.pools import pools_of, shares
from gfair.core.scheduler import (
    Admitted,
    CarriedOut,
    Ended,
    EntitlementsPublished,
    Node,
    Reply,
    SchedulerConfig,
    ServersChanged,
    SplitStride,
    Start,
    Stop,
    TypeProfiled,
)
from gfair.core.scheduler.residency import job_key
from gfair.core.switch_costs import DEFAULT_COSTS, SwitchCosts
from gfair.core.throughput import ThroughputEstimator, ThroughputTable
from gfair.core.tickets import check_tickets
from gfair.core.trading import Trade
from gfair.core.usage_decay import DecayedUsage
from gfair.journal import Header, JournalFile
from gfair.sim.policy import EVERY_QUANTUM, UNTIL_NEXT_EVENT, Admission, PolicyDecision
from gfair.sim.trace import TraceJob


class GandivaFairMachine:
    name = "gandiva-fair"
    limits_arrays = True  # the machine's snapshot does

    def __init__(
        self,
        cluster: Cluster,
        tickets: Mapping[str, float],
        throughput: ThroughputTable,
        config: SchedulerConfig | None = None,
        default_tickets: float = 1.0,
        costs: SwitchCosts = DEFAULT_COSTS,
        journal: JournalFile | None = None,
    ) -> None:
        self._config = config = config or SchedulerConfig()
        self._costs = costs  # each job's, unless its trace row gives its own
        self._tickets = dict(tickets)
        self._default_tickets = default_tickets
        self._pools = pools_of(cluster)
        self._capacity = {g: pool.gpus for g, pool in self._pools.items()}  # slowest first
        machine_config = replace(
            config,
            operator_costs=costs,
            tickets_of=self._user_tickets,
            # The simulated nodes confirm every stop before any start.
            moves_at_once=True,
        )
        if journal is not None:
            journal.begin(Header(machine_config, self._tickets, default_tickets, throughput))
        self.machine = SplitStride(
            machine_config,
            # As the live service's: profiles arrive averaged (alpha 1).
            ThroughputEstimator(throughput, alpha=1.0),
            journal=journal,
        )
        # The servers are announced at the first quantum, so that it decides from the whole
        # first batch of jobs (as the live cluster's first tick after its nodes register).
        self._nodes = tuple(Node(s.id, s.generation, tuple(range(s.gpus))) for s in cluster.servers)
        self._profiler = ThroughputEstimator(throughput, alpha=config.throughput_alpha)
        # The auction's inputs: the active jobs (user, job type, GPUs, array membership).
        self._jobs: dict[str, tuple[str, str | None, int, arrays.ArrayMember | None]] = {}
        self._keys: dict[str, str] = {}  # trace job id -> the machine's job key
        self._ids: dict[str, str] = {}  # and back
        self._revision = 0
        self._auction_due = True
        self._trades: frozenset[Trade] = frozenset()
        # User -> GPUs its jobs ask per (job type, gang size), and its speeds as the auction
        # bids them, until its jobs or profiles change.
        self._gangs: dict[str, Counter[tuple[str | None, int]]] = {}
        self._speeds: dict[str, dict[str, float]] = {}
        tree = config.shares
        self._usage: DecayedUsage | None = None
        if tree is not None and tree.decayed and tree.half_life_s is not None:
            self._usage = DecayedUsage(tree.half_life_s)
        self._charged_at: float | None = None
        self._filled: dict[str, tuple[str, ...]] = {}  # started between ticks, not yet told
        self._changed = True  # since the last tick (the next one may decide otherwise)
        self._waiting = -1  # runnable jobs the last tick left without GPUs (-1: none yet)
        # Jobs with limits (a time limit), checked at every tick: none of its quanta is skipped.
        self._limited: set[str] = set()

    # -- the policy -----------------------------------------------------------------------

    def submit(self, job: TraceJob, now: float) -> Admission:
        if job.id in self._keys:
            return Admission(False, f"job {job.id} is already submitted")
        if job.gpus < 1:
            return Admission(False, f"job {job.id}: gpus must be >= 1, got {job.gpus}")
        try:
            check_tickets(f"user {job.user}", self._user_tickets(job.user))
        except ValueError as error:
            return Admission(False, str(error))
        estimator = self.machine.estimator
        speeds = estimator.job_speeds(job.id, job.user, job.job_type, self._pools)
        views = [
            PoolView(pool, speeds[g] if estimator.fits(job.job_type, g) else 0.0)
            for g, pool in self._pools.items()
        ]
        admitted = filter_pools(job.gpus, job.job_type, views)
        if not admitted.accepted:
            reason = rejection_reason(job.gpus, views, admitted.rejections)
            return Admission(False, reason, rule=admitted.rule)
        key = f"{job.user}.{job.id}"
        self._keys[job.id], self._ids[key] = key, job.id
        member = None
        if job.array is not None:
            member = arrays.ArrayMember(arrays.array_key(job.user, job.array), job.array_limit)
        self._jobs[job.id] = (job.user, job.job_type, job.gpus, member)
        self._changed = self._auction_due = True
        self._gangs.setdefault(job.user, Counter())[(job.job_type, job.gpus)] += job.gpus
        self._speeds.pop(job.user, None)
        launch = job.launch()
        reply = self.machine.apply(
            Admitted(
                user=job.user,
                job_id=job.id,
                now=now,
                gpus=job.gpus,
                weight=1.0,
                job_type=job.job_type,
                array=job.array,
                array_limit=job.array_limit,
                costs=job.costs(self._costs),
                launch=launch,
            )
        )
        self._carry_out(reply, now)
        if launch is not None:
            self._limited.add(job.id)
        usable = admitted.usable
        fastest = max(usable, key=lambda g: (speeds[g], generation_rank(g)))
        return Admission(True, f"can run on {', '.join(sorted(usable))}", fastest)

    def finish(self, job_id: str, now: float) -> None:
        key = self._keys.pop(job_id, None)
        if key is None:
            raise KeyError(f"unknown job {job_id!r}")
        self._charge(now)  # what it held up to now, before it lets go
        user, job_type, gpus, _ = self._jobs.pop(job_id)
        gangs = self._gangs[user]
        gangs[(job_type, gpus)] -= gpus
        if gangs[(job_type, gpus)] <= 0:
            del gangs[(job_type, gpus)]
        if not gangs:
            del self._gangs[user]
        del self._ids[key]
        self._limited.discard(job_id)
        self._filled.pop(job_id, None)
        self._profiler.forget_job(job_id)
        self._changed = True
        # The GPUs it leaves go to waiting jobs on the shares in force; new ones follow at the
        # next quantum.
        reply = self.machine.apply(Ended(user=user, job_id=job_id, now=now, state="completed"))
        self._carry_out(reply, now)
        self._auction_due = True
        self._speeds.pop(user, None)

    def observe(self, job_id: str, generation: str, rate: float, now: float) -> None:
        user, job_type, _, _ = self._jobs[job_id]
        self._profiler.observe(job_id, user, job_type, generation, rate)
        rates = self._profiler.user_rates(user, job_type)
        if not self.machine.apply(TypeProfiled(user, job_type, rates)).changed:
            return
        self._changed = True
        # Shares depend on speeds only through trading, and on the user's bid only: a profile
        # that leaves the bid as it was (the common case) leaves them as they are.
        before = self._speeds.pop(user, None)
        if self._config.trading and (before is None or self._bid(user) != before):
            self._auction_due = True

    def plan(self, now: float) -> PolicyDecision:
        if not self.machine.nodes:
            self.machine.apply(ServersChanged(self._nodes))
        new = self._auction(now)
        plan = self.machine.tick(now)
        if plan.short:
            raise RuntimeError(f"{self.name}: chosen jobs found too few free GPUs: {plan.short}")
        stops = [stop for turn in plan.turns for stop in turn.stops] + list(plan.strays)
        starts = [start for turn in plan.turns for start in turn.starts]
        self._confirm(stops, starts, now, between_ticks=False)
        self._filled.clear()  # the runs below tell the simulator of them
        self._waiting = plan.waiting
        self._changed = False
        ended = {self._ids[job_key(t.user, t.job_id)]: t.reason for t in plan.timed_out}
        return PolicyDecision(runs=self._runs(), trades=new, ended=ended)

    def fill(self, now: float) -> dict[str, tuple[str, ...]]:
        filled, self._filled = self._filled, {}
        return filled

    def quiet_until(self, now: float) -> float:
        # When every runnable job ran and nothing changed since, the next quantum repeats this
        # one until something does.
        if self._waiting == 0 and not self._changed and self._usage is None and not self._limited:
            return UNTIL_NEXT_EVENT
        return EVERY_QUANTUM

    def usage(self) -> dict[str, float]:
        """User -> decayed GPU-seconds as last charged, what the auction weighs (the shares
        tree's decayed mode; empty otherwise)."""
        return self._usage.usage() if self._usage is not None else {}

    # -- the trading auction --------------------------------------------------------------

    def _user_tickets(self, user: str) -> float:
        flat = self._tickets.get(user, self._default_tickets)
        tree = self._config.shares
        return flat if tree is None else tree.tickets_of(user, flat)

    def _auction(self, now: float) -> int:
        """Publish the shares when they may have changed; how many trades came into force."""
        if self._usage is not None:
            self._charge(now)
            self._auction_due = True  # the usage moved: the weights with it
        if not self._auction_due or not self._jobs:
            return 0
        self._auction_due = False
        demand = accounts.demand(
            (user, gpus, member) for user, _, gpus, member in self._jobs.values()
        )
        users = sorted(demand)
        speeds = {u: self._bid(u) for u in users} if self._config.trading else None
        result = shares(
            self._capacity,
            {u: self._user_tickets(u) for u in users},
            {u: demand[u] for u in users},
            speeds,
            min_seller_gain=self._config.min_seller_gain,
            tree=self._config.shares,
            usage=self._usage.usage() if self._usage is not None else None,
        )
        self._revision += 1
        self.machine.apply(EntitlementsPublished(self._revision, result.entitled))
        in_force = frozenset(result.trades)
        new = len(in_force - self._trades)
        self._trades = in_force
        return new

    def _bid(self, user: str) -> dict[str, float]:
        """The user's speeds as the auction bids them (`ThroughputEstimator.user_speeds` of its
        gangs), kept until its jobs or profiles change."""
        speeds = self._speeds.get(user)
        if speeds is None:
            estimator = self.machine.estimator
            gangs = self._gangs.get(user, Counter())
            speeds = self._speeds[user] = estimator.user_speeds(user, gangs, self._capacity)
        return speeds

    def _charge(self, now: float) -> None:
        """Decayed mode: charge each user the GPUs its jobs held from the last charge to `now`
        (what the live auction's usage meter is told)."""
        if self._usage is None:
            return
        since, self._charged_at = self._charged_at, now
        if since is None or now <= since:
            return
        held: dict[str, int] = {}
        for job in self.machine.index.resident_jobs():
            gpus = sum(len(s.gpu_indices) for s in job.stays.values() if s.holds_gpus)
            held[job.user] = held.get(job.user, 0) + gpus
        self._usage.advance(now)
        for user, gpus in held.items():
            if gpus:
                self._usage.charge(user, gpus, now - since)

    # -- the nodes ------------------------------------------------------------------------

    def _carry_out(self, reply: Reply, now: float) -> None:
        """What an event between ticks asks of the nodes."""
        starts = [start for turn in reply.starts.turns for start in turn.starts]
        if starts:
            self._charge(now)  # the GPUs held so far, before the new jobs hold theirs
            self._changed = True
        self._confirm(reply.stops, starts, now, between_ticks=True)

    def _confirm(
        self, stops: Sequence[Stop], starts: Sequence[Start], now: float, *, between_ticks: bool
    ) -> None:
        """The nodes run the stops, then the starts, and report them at once in that order
        (`CarriedOut`: the stops' reports together, the machine filling the GPUs they leave
        idle once, after the last; then each start's); what the releases let start is carried
        out in turn."""
        if not stops and not starts:
            return
        released = self.machine.apply(CarriedOut(now, tuple(stops), tuple(starts)))
        if between_ticks:
            for start in starts:
                self._filled[self._ids[start.key]] = start.servers
        if released.changed:
            self._carry_out(released, now)

    def _runs(self) -> dict[str, tuple[str, ...]]:
        """Server -> the jobs holding GPUs there (by trace id, sorted: an unchanged server
        compares equal to the last decision's)."""
        ids, on_node = self._ids, self.machine.index.on_node
        holding = {
            n: [ids[k] for k, stay in here.items() if stay.holds_gpus]
            for n, here in on_node.items()
        }
        return {node_id: tuple(sorted(held)) for node_id, held in holding.items() if held}
