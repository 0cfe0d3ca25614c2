"""Rule 2's cost control: a user's chosen jobs keep the pools they ran in."""

from __future__ import annotations

import operator
from collections import defaultdict

from .cycle import Choice, Cycle
from .cycle import own as own_servers

_USER_SIZE = operator.attrgetter("job.user", "job.gpus")
_SPEEDS = operator.attrgetter("job.speeds")


def keep_pools(cycle: Cycle) -> None:
    """Rule 2's cost control: which of a user's chosen jobs fills which of its places is free
    (the stride only fixed how many GPUs the user runs in each pool), so jobs of the same size
    trade places until as many as possible stay in the pool they ran in. A group whose trade
    would put a job where it cannot run (a user's jobs of different types) keeps its places."""
    pool_of = cycle.layout.generation
    groups: defaultdict[tuple[str, int], list[Choice]] = defaultdict(list)
    values = list(cycle.chosen.values())
    for key, choice in zip(map(_USER_SIZE, values), values, strict=True):
        groups[key].append(choice)
    for group in groups.values():
        if len(group) < 2:
            continue
        places: dict[str, list[tuple[str, ...]]] = {}
        for choice in group:
            places.setdefault(choice.pool, []).append(choice.servers)
        # Jobs of one type share their speeds' dict: each is looked at once.
        speeds = {id(table): table for table in map(_SPEEDS, group)}.values()
        if any(table.get(pool, 0.0) <= 0 for table in speeds for pool in places):
            continue
        unplaced: list[Choice] = []
        for choice in group:
            own = own_servers(choice.job)
            ran = pool_of.get(own[0]) if own else None
            if ran is not None and places.get(ran):
                choice.pool, choice.servers = ran, places[ran].pop()
            else:
                unplaced.append(choice)
        left = [(pool, servers) for pool, taken in places.items() for servers in taken]
        for choice, (pool, servers) in zip(unplaced, left, strict=True):
            choice.pool, choice.servers = pool, servers
