"""Users' shares of each pool, and the stride tickets that make their jobs get them.

Placement (pool choice, ticket load of servers) and split-stride (per-job stride tickets) must
agree on both, so both compute them here, from the core:

- A user's share of a pool, in GPUs, is what the trading auction last published
  (`EntitlementsUpdated`) when that covers every user with demand; otherwise the no-trading
  entitlement the core computes from tickets and demand (`pools.entitlements`: the cluster
  water-filled by tickets, capped by demand, held as the same fraction of every pool). Mixing the
  two would compare GPUs of different divisions, so it is one or the other for everybody.
- A job's stride tickets in pool P are its user's share of P divided among the user's jobs in P
  in proportion to their weights (equal unless the user gave some, docs/design.md §1.1). A job in a
  pool where its user holds no share (placed there on idle capacity) gets `surplus_weight` times its
  user's average: it runs on what others leave idle.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gfair.core.pools import entitlements

Shares = Mapping[str, Mapping[str, float]]  # user -> pool -> GPUs of share

_EPS = 1e-9
DEFAULT_SURPLUS_WEIGHT = 1e-3


@dataclass(frozen=True, slots=True)
class ActiveJob:
    key: str
    user: str
    pool: str
    weight: float = 1.0


def user_shares(
    pool_gpus: Mapping[str, float],
    tickets: Mapping[str, float],
    demand: Mapping[str, float],
    published: Shares | None = None,
) -> dict[str, dict[str, float]]:
    """User -> pool -> GPUs of share for the users with demand (see module doc)."""
    active = {user: gpus for user, gpus in demand.items() if gpus > 0}
    if published and all(user in published for user in active):
        return {
            user: {pool: float(published[user].get(pool, 0.0)) for pool in pool_gpus}
            for user in active
        }
    return entitlements(pool_gpus, {user: tickets[user] for user in active}, active)


def group_rate(
    held: Mapping[str, float],
    pool: str,
    members: int,
    weight_sum: float,
    jobs_of_user: int,
    surplus_weight: float = DEFAULT_SURPLUS_WEIGHT,
) -> float:
    """Stride tickets per unit of weight of a user's `members` jobs in `pool` (module doc).

    `held` is the user's share per pool, `weight_sum` its jobs' weights there, `jobs_of_user`
    how many jobs it has in all pools.
    """
    if members <= 0 or weight_sum <= 0:
        return 0.0
    share = held.get(pool, 0.0)
    if share <= _EPS:
        average = sum(held.values()) / max(jobs_of_user, 1)
        share = surplus_weight * (average if average > _EPS else 1.0) * members
    return share / weight_sum


def job_tickets(
    shares: Shares, jobs: Iterable[ActiveJob], surplus_weight: float = DEFAULT_SURPLUS_WEIGHT
) -> dict[str, float]:
    """Job key -> stride tickets (see module doc)."""
    groups: dict[tuple[str, str], list[ActiveJob]] = defaultdict(list)
    jobs_of_user: dict[str, int] = defaultdict(int)
    for job in jobs:
        groups[(job.user, job.pool)].append(job)
        jobs_of_user[job.user] += 1
    out: dict[str, float] = {}
    for (user, pool), members in groups.items():
        rate = group_rate(
            shares.get(user, {}),
            pool,
            len(members),
            sum(job.weight for job in members),
            jobs_of_user[user],
            surplus_weight,
        )
        for job in members:
            out[job.key] = rate * job.weight
    return out
