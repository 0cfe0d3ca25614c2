"""Tickets: a user's tickets split among its jobs, and water-filling of shares.

See docs/design.md §1.1.

`water_fill` divides a capacity among claimants in proportion to their weights (tickets), but
never gives anyone more than its demand; what a capped claimant cannot use is divided among the
others, again in proportion to their weights, until everyone is either capped or shares the
rest. The result sums to ``min(capacity, total demand)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TypeVar

K = TypeVar("K")

# Tickets are relative, but weights far apart break the arithmetic before they mean anything: a
# weight of 1e-310 makes one quantum's pass step 1e310 (infinite), one of 1e300 a pass that never
# moves. Every user's tickets and every job's weight lies within these bounds: the event
# contract, the services' settings and the core all check them.
MIN_TICKETS = 1e-3
MAX_TICKETS = 1e6


def check_tickets(what: str, value: float) -> float:
    """`value` as tickets or a weight, or a `ValueError` saying what is wrong with it."""
    if not (math.isfinite(value) and MIN_TICKETS <= value <= MAX_TICKETS):
        raise ValueError(
            f"{what}: tickets must be a finite number from {MIN_TICKETS:g} to {MAX_TICKETS:g}, "
            f"not {value!r}"
        )
    return float(value)


def split_user_tickets(
    user_tickets: Mapping[str, float], jobs_by_user: Mapping[str, Iterable[str]]
) -> dict[str, float]:
    """Job id -> tickets: each user's tickets divided equally among its active jobs."""
    out: dict[str, float] = {}
    for user, jobs in jobs_by_user.items():
        jobs = tuple(jobs)
        if not jobs:
            continue
        tickets = user_tickets[user]
        if not tickets > 0:
            raise ValueError(f"user {user}: tickets must be > 0, got {tickets}")
        for job_id in jobs:
            out[job_id] = tickets / len(jobs)
    return out


def water_fill(
    capacity: float, weights: Mapping[K, float], demands: Mapping[K, float]
) -> dict[K, float]:
    """Split `capacity` in proportion to `weights`, capped by `demands` (max-min weighted).

    Every key of `demands` gets an entry; a key missing from `weights` is an error.
    """
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    for key, demand in demands.items():
        if demand < 0:
            raise ValueError(f"{key}: demand must be >= 0, got {demand}")
        if key not in weights:
            raise ValueError(f"{key}: has a demand but no weight")
        if demand > 0 and not weights[key] > 0:
            raise ValueError(f"{key}: weight must be > 0, got {weights[key]}")
    share: dict[K, float] = {key: 0.0 for key in demands}
    # Visiting claimants by demand per weight, each one is capped iff its demand is below its
    # proportional slice of what is left; after the first one that is not, nobody else is.
    hungry = sorted((k for k, d in demands.items() if d > 0), key=lambda k: demands[k] / weights[k])
    left = float(capacity)
    weight_left = sum(weights[k] for k in hungry)
    for index, key in enumerate(hungry):
        slice_ = left * weights[key] / weight_left
        if demands[key] <= slice_:
            share[key] = float(demands[key])
            left -= demands[key]
            weight_left -= weights[key]
            continue
        for rest in hungry[index:]:
            share[rest] = left * weights[rest] / weight_left
        break
    return share


def proportional_fractions(weights: Mapping[K, float]) -> dict[K, float]:
    """Each key's fraction of the total weight."""
    total = sum(weights.values())
    if not total > 0:
        raise ValueError("weights must add up to more than 0")
    return {key: w / total for key, w in weights.items()}
