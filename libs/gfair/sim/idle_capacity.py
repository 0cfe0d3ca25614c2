"""Idle GPUs that a waiting job could have used: the work-conservation measure of a replay.

"GPUs busy while jobs wait" (`report.Summary.busy_while_waiting`) counts every idle GPU while
any job waits, including GPUs no waiting job fits: a 12-GPU gang waiting beside four idle
GPUs of another pool, or beside three idle GPUs on three servers, cannot use them under any
policy, so on clusters of big gangs that fraction stays low whoever schedules. What a policy
is answerable for is the idle GPUs the waiting jobs *could* take: `usable_idle_gpus` counts
them by placing the waiting jobs on the idle GPUs greedily, largest gangs first, each in a
pool its type runs on (one-server jobs best fit on one server; larger gangs on whole idle
servers of one pool). Greedy packing is a lower bound on what the best packing uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WaitingClass:
    """`count` waiting jobs of `gpus` GPUs each, whose type runs on `pools`."""

    gpus: int
    pools: tuple[str, ...]
    count: int


def usable_idle_gpus(
    servers: Mapping[str, Sequence[tuple[int, int]]], waiting: Iterable[WaitingClass]
) -> int:
    """GPUs the `waiting` jobs can take among the idle ones; `servers`: pool -> (free GPUs,
    GPUs) of each of its servers."""
    free = {pool: [f for f, _ in listed] for pool, listed in servers.items()}
    size = {pool: [g for _, g in listed] for pool, listed in servers.items()}
    largest = {pool: max(sizes, default=0) for pool, sizes in size.items()}
    left = sum(sum(f) for f in free.values())
    used = 0
    for group in sorted(waiting, key=lambda c: -c.gpus):
        for _ in range(group.count):
            if left <= 0:
                return used
            taken = 0
            for pool in group.pools:
                if pool in free:
                    taken = _take(free[pool], size[pool], largest[pool], group.gpus)
                    if taken:
                        break
            if not taken:
                break  # the class's other jobs are the same size: none fits either
            used += taken
            left -= taken
    return used


def _take(free: list[int], size: list[int], largest: int, gpus: int) -> int:
    """Place one job on `free` (changed in place; `largest` is the largest of `size`); the
    GPUs it holds, 0 when it does not fit."""
    if gpus <= largest:
        best = None
        for at, available in enumerate(free):
            if available >= gpus and (best is None or available < free[best]):
                best = at
        if best is None:
            return 0
        free[best] -= gpus
        return gpus
    idle = sorted(
        (at for at, available in enumerate(free) if available == size[at]), key=lambda at: -size[at]
    )
    chosen: list[int] = []
    held = 0
    for at in idle:
        if held >= gpus:
            break
        chosen.append(at)
        held += size[at]
    if held < gpus:
        return 0
    for at in chosen:
        free[at] = 0
    return held
