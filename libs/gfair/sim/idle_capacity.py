"""Idle GPUs that a waiting job could have used: the work-conservation measure of a replay.

"GPUs busy while jobs wait" (`report.Summary.busy_while_waiting`) counts every idle GPU while
any job waits, including GPUs no waiting job fits: a 12-GPU gang waiting beside four idle
GPUs of another pool, or beside three idle GPUs on three servers, cannot use them under any
policy, so on clusters of big gangs that fraction stays low whoever schedules. What a policy
is answerable for is the idle GPUs the waiting jobs *could* take: `usable_idle_gpus` counts
them by placing the waiting jobs on the idle GPUs greedily, largest gangs first, each in a
pool its type runs on, with the kernel's packing rule (`gfair.core.packing`: best fit on one
server; larger gangs on whole idle servers of one pool). Greedy packing is a lower bound on
what the best packing uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gfair.core.packing import Packing


@dataclass(frozen=True, slots=True)
class WaitingClass:
    """`count` waiting jobs of `gpus` GPUs each, whose type runs on `pools`."""

    gpus: int
    pools: tuple[str, ...]
    count: int


def usable_idle_gpus(rooms: Mapping[str, Packing], waiting: Iterable[WaitingClass]) -> int:
    """GPUs the `waiting` jobs can take among the idle ones; `rooms`: each pool's free GPUs
    (taken as the jobs are placed)."""
    left = sum(room.total for room in rooms.values())
    for group in sorted(waiting, key=lambda c: -c.gpus):
        for _ in range(group.count):
            if not any(pool in rooms and rooms[pool].place(group.gpus, ()) for pool in group.pools):
                break  # the class's other jobs are the same size: none fits either
    return left - sum(room.total for room in rooms.values())
