"""The auction's inputs and the allocation the core derives from them (docs/design.md §2.4, §2.5).

Inputs: the active jobs (who demands how many GPUs, of which job types), the pools (GPUs per
generation on nodes that take work) and the users' speed profiles (from the profiler). The
allocation composes the core exactly as the simulator's `gandiva-fair` policy does: each active
user's ticket share of the cluster, water-filled by demand and held as the same fraction of every
pool (`pools.shares`: `pools.entitlements`, then second-price trades between pools) bid with the
users' estimated speeds (`ThroughputEstimator.user_speeds`). With a `ShareTree` (the shares
file) the ticket share is the tree's water-fill, down its accounts; in its decayed mode every
level weighs the users' decayed usage the caller passes (`usage.UsageMeter`), as the
simulator's does.

No I/O and no clock: the service persists the inputs and passes times in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from gfair.core import accounts, pools
from gfair.core.arrays import ArrayMember, array_key
from gfair.core.cluster import generation_rank
from gfair.core.shares_tree import ShareTree
from gfair.core.throughput import ThroughputEstimator, ThroughputTable
from gfair.core.trading import Trade, effective_throughput
from gfair.events.fields import Generation, GpuCount, JobId, Name, NodeId, UserName
from gfair.events.job_array import ArrayMembership
from gfair.state.profile_record import type_key
from gfair.state.share_record import AccountShare, PoolShare, TradeRecord, UserShare

# Shares are compared and stored to this many decimals (GPUs): finer differences are noise of
# floating point, not a change worth a new revision.
_DECIMALS = 9
# A user that cannot use the slow pool at all bids infinity; records and events carry a finite
# stand-in far above any real speedup.
MAX_BID = 1e6


class _Input(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ActiveJob(_Input):
    user: UserName
    job_id: JobId
    gpus: GpuCount
    job_type: Name | None = None
    array: ArrayMembership | None = None

    @property
    def key(self) -> str:
        return f"job.{self.user}.{self.job_id}"

    @property
    def member(self) -> ArrayMember | None:
        if self.array is None:
            return None
        return ArrayMember(array_key(self.user, self.array.id), self.array.limit)


class PoolNode(_Input):
    node_id: NodeId
    gpus: dict[Generation, int] = Field(description="GPUs per generation on the node")
    failed: bool = False
    # Sticky until an operator uncordons the node, whatever its heartbeats say.
    quarantined: bool = False
    as_of: datetime

    @property
    def key(self) -> str:
        return f"node.{self.node_id}"

    @property
    def takes_work(self) -> bool:
        return not (self.failed or self.quarantined)


class SpeedProfile(_Input):
    user: UserName
    job_type: Name | None = None
    rates: dict[Generation, float]
    as_of: datetime

    @property
    def key(self) -> str:
        return f"profile.{self.user}.{type_key(self.job_type)}"


@dataclass(frozen=True)
class Allocation:
    capacity: dict[str, int]
    users: dict[str, UserShare]
    trades: tuple[TradeRecord, ...]
    accounts: dict[str, AccountShare] = field(default_factory=dict)  # with a tree: every account


class Market:
    def __init__(
        self,
        table: ThroughputTable,
        tickets: Callable[[str], float],
        *,
        trading: bool = True,
        min_seller_gain: float = 0.10,
        tree: ShareTree | None = None,
    ) -> None:
        if min_seller_gain < 0:
            raise ValueError(f"min_seller_gain must be >= 0, got {min_seller_gain}")
        self.tickets = tickets  # flat: a user the tree names has the tree's
        self.tree = tree
        self.trading = trading
        self.min_seller_gain = min_seller_gain
        # alpha 1: a profile replaces the previous one; the profiler already averaged.
        self.estimator = ThroughputEstimator(table, alpha=1.0)
        self.jobs: dict[tuple[str, str], ActiveJob] = {}
        self.nodes: dict[str, PoolNode] = {}
        self.profiles: dict[tuple[str, str | None], SpeedProfile] = {}

    # -- inputs (each returns whether anything changed) -----------------------------------

    def restore(
        self,
        jobs: Iterable[ActiveJob],
        nodes: Iterable[PoolNode],
        profiles: Iterable[SpeedProfile],
    ) -> None:
        for job in jobs:
            self.add_job(job)
        for node in nodes:
            self.set_node(node)
        for profile in profiles:
            self.set_profile(profile)

    def add_job(self, job: ActiveJob) -> bool:
        if self.jobs.get((job.user, job.job_id)) == job:
            return False
        self.jobs[job.user, job.job_id] = job
        return True

    def remove_job(self, user: str, job_id: str) -> ActiveJob | None:
        return self.jobs.pop((user, job_id), None)

    def node(self, node_id: str) -> PoolNode | None:
        return self.nodes.get(node_id)

    def set_node(self, node: PoolNode) -> bool:
        """Take a node's newer state; an older one (a late redelivery) changes nothing."""
        old = self.nodes.get(node.node_id)
        if old is not None and (node.as_of < old.as_of or node == old):
            return False
        self.nodes[node.node_id] = node
        return old is None or (old.gpus, old.takes_work) != (node.gpus, node.takes_work)

    def set_profile(self, profile: SpeedProfile) -> bool:
        key = (profile.user, profile.job_type)
        old = self.profiles.get(key)
        if old is not None and (profile.as_of < old.as_of or profile.rates == old.rates):
            return False
        self.profiles[key] = profile
        self.estimator.observe_profile(profile.user, profile.job_type, profile.rates)
        return True

    def set_tree(self, tree: ShareTree | None) -> bool:
        """Take a new shares tree (an operator's change); whether it differs."""
        if tree == self.tree:
            return False
        self.tree = tree
        return True

    def tickets_of(self, user: str) -> float:
        flat = self.tickets(user)
        return flat if self.tree is None else self.tree.tickets_of(user, flat)

    # -- the allocation -------------------------------------------------------------------

    def capacity(self) -> dict[str, int]:
        """GPUs per pool on nodes that take work, slowest generation first."""
        gpus: Counter[str] = Counter()
        for node in self.nodes.values():
            if node.takes_work:
                gpus.update(node.gpus)
        return {g: gpus[g] for g in sorted(gpus, key=generation_rank) if gpus[g] > 0}

    def allocate(self, usage: Mapping[str, float] | None = None) -> Allocation:
        """The allocation of the inputs; `usage` (user -> decayed GPU-seconds) counts in the
        tree's decayed mode only."""
        capacity = self.capacity()
        demand = accounts.demand((job.user, job.gpus, job.member) for job in self.jobs.values())
        counts: Counter[str] = Counter()
        gangs: dict[str, Counter[tuple[str | None, int]]] = {}
        for job in self.jobs.values():
            counts[job.user] += 1
            gangs.setdefault(job.user, Counter())[(job.job_type, job.gpus)] += job.gpus
        users = sorted(demand)
        if not capacity or not users:
            return Allocation(capacity, {}, (), self._accounts({}, {}))
        generations = tuple(capacity)
        tickets = {u: self.tickets_of(u) for u in users}
        asked = {u: demand[u] for u in users}
        if self.tree is None or not self.tree.decayed:
            usage = None
        fair = pools.entitlements(capacity, tickets, asked, self.tree, usage)
        speeds = {u: self.estimator.user_speeds(u, gangs[u], capacity) for u in users}
        result = pools.shares(
            capacity,
            tickets,
            asked,
            speeds if self.trading else None,
            min_seller_gain=self.min_seller_gain,
            tree=self.tree,
            usage=usage,
        )
        held, trades = result.entitled, result.trades
        shares = {
            u: UserShare(
                user=u,
                tickets=tickets[u],
                jobs=counts[u],
                demand=int(demand[u]),
                pools={
                    g: PoolShare(fair=_round(fair[u][g]), entitled=_round(held[u][g]))
                    for g in generations
                },
                speeds={g: _round(s) for g, s in speeds[u].items()},
                throughput_fair=_round(effective_throughput(fair[u], speeds[u], demand[u])),
                throughput_entitled=_round(effective_throughput(held[u], speeds[u], demand[u])),
            )
            for u in users
        }
        records = tuple(_trade_record(t) for t in trades if _round(t.quantity) > 0)
        below: dict[str, float] = {}
        if self.tree is not None:
            below = self.tree.fill(float(sum(capacity.values())), tickets, asked, usage).accounts
        return Allocation(capacity, shares, records, self._accounts(below, asked))

    def _accounts(
        self, below: dict[str, float], asked: dict[str, float]
    ) -> dict[str, AccountShare]:
        """Every account of the tree, with the GPUs of its subtree's ticket share and what its
        users ask."""
        if self.tree is None:
            return {}
        demand: dict[str, float] = {}
        for user, gpus in asked.items():
            for path in self.tree.ancestors(self.tree.account_of(user)):
                demand[path] = demand.get(path, 0.0) + gpus
        return {
            path: AccountShare(
                tickets=tickets,
                fair=_round(below.get(path, 0.0)),
                demand=_round(demand.get(path, 0.0)),
            )
            for path, tickets in sorted(self.tree.accounts.items())
        }


def _round(value: float) -> float:
    return round(value, _DECIMALS) + 0.0  # + 0.0 turns -0.0 into 0.0


def _trade_record(t: Trade) -> TradeRecord:
    return TradeRecord(
        buyer=t.buyer,
        seller=t.seller,
        fast_pool=t.fast_pool,
        slow_pool=t.slow_pool,
        quantity=_round(t.quantity),
        price=_round(t.price),
        buyer_bid=_round(min(t.buyer_bid, MAX_BID)),
        seller_bid=_round(min(t.seller_bid, MAX_BID)),
    )
