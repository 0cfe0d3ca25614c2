"""Pools (one per GPU generation) and per-user per-pool entitlements (docs/design.md §2.4).

Without trading each active user is entitled to its ticket share of every pool, water-filled by
demand: the cluster's GPUs are water-filled among the active users by tickets, capped by each
user's demand (the GPUs its active jobs ask), and a user's result is then taken as the same
fraction of every pool. A user asking less than its share thus holds that little of each pool,
and what it leaves goes to the others in proportion to their tickets. With a `ShareTree` the
water-fill is the tree's, down its accounts (`shares_tree`); without one, or with one without
accounts, it is the flat one. In the tree's decayed mode the driver passes each user's decayed
usage (`usage_decay.DecayedUsage`), and the tree weighs siblings by it (`ShareTree.fill`).
Trading (`trading.py`) later moves share between pools.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gfair.core.cluster import Cluster, Server
from gfair.core.shares_tree import ShareTree
from gfair.core.tickets import water_fill
from gfair.core.trading import Trade, trade


@dataclass(frozen=True)
class Pool:
    generation: str
    servers: tuple[Server, ...]
    gpus: int = field(init=False)
    largest_server: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", sum(s.gpus for s in self.servers))
        object.__setattr__(self, "largest_server", max((s.gpus for s in self.servers), default=0))


def pools_of(cluster: Cluster) -> dict[str, Pool]:
    """Generation -> pool, slowest generation first."""
    return {g: Pool(g, cluster.by_generation(g)) for g in cluster.generations}


def entitlements(
    pool_gpus: Mapping[str, float],
    tickets: Mapping[str, float],
    demand: Mapping[str, float],
    tree: ShareTree | None = None,
    usage: Mapping[str, float] | None = None,
) -> dict[str, dict[str, float]]:
    """User -> pool -> GPUs of share, for the users with demand (see module doc); `usage`
    (user -> decayed GPU-seconds) counts only with a `tree` in the decayed mode."""
    total = float(sum(pool_gpus.values()))
    if total <= 0:
        return {user: dict.fromkeys(pool_gpus, 0.0) for user in demand}
    if tree is None:
        shares = water_fill(total, tickets, demand)
    else:
        shares = tree.water_fill(total, tickets, demand, usage if tree.decayed else None)
    return {
        user: {pool: share * gpus / total for pool, gpus in pool_gpus.items()}
        for user, share in shares.items()
    }


@dataclass(frozen=True)
class Shares:
    entitled: dict[str, dict[str, float]]  # user -> pool -> GPUs of share, after trading
    trades: tuple[Trade, ...]


def shares(
    pool_gpus: Mapping[str, float],
    tickets: Mapping[str, float],
    demand: Mapping[str, float],
    speeds: Mapping[str, Mapping[str, float]] | None = None,
    *,
    min_seller_gain: float = 0.10,
    tree: ShareTree | None = None,
    usage: Mapping[str, float] | None = None,
) -> Shares:
    """Entitlements (module doc), then, with `speeds` given, the trades among the users
    (`trading.trade`, demand-capped): the one derivation of per-pool shares every driver uses.
    `pool_gpus` lists the pools slowest first; `tree`, the accounts, and `usage`, the users'
    decayed usage for its decayed mode (`entitlements`)."""
    held = entitlements(pool_gpus, tickets, demand, tree, usage)
    if speeds is None or len(pool_gpus) < 2 or len(held) < 2:
        return Shares(held, ())
    result = trade(held, speeds, tuple(pool_gpus), min_seller_gain=min_seller_gain, demands=demand)
    return Shares(result.holdings, result.trades)
