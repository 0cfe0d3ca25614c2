"""Idle GPUs a waiting job could use (`gfair.sim.idle_capacity`), by hand."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gfair.core.cluster import Server
from gfair.core.packing import Packing
from gfair.sim.idle_capacity import WaitingClass
from gfair.sim.idle_capacity import usable_idle_gpus as usable


def usable_idle_gpus(
    servers: Mapping[str, Sequence[tuple[int, int]]], waiting: list[WaitingClass]
) -> int:
    """`usable` on pools given as (free GPUs, GPUs) per server."""
    rooms = {}
    for pool, listed in servers.items():
        ids = [f"{pool}-{at}" for at in range(len(listed))]
        machines = tuple(Server(i, pool, gpus) for i, (_, gpus) in zip(ids, listed, strict=True))
        rooms[pool] = Packing(machines, {i: free for i, (free, _) in zip(ids, listed, strict=True)})
    return usable(rooms, waiting)


def test_a_gang_too_big_for_the_scattered_idle_gpus_uses_none_of_them() -> None:
    # Three idle GPUs on three servers: a 2-GPU job fits none of them alone.
    servers = {"v100": [(1, 4), (1, 4), (1, 4)]}
    assert usable_idle_gpus(servers, [WaitingClass(2, ("v100",), 5)]) == 0
    assert usable_idle_gpus(servers, [WaitingClass(1, ("v100",), 5)]) == 3
    assert usable_idle_gpus(servers, [WaitingClass(1, ("v100",), 2)]) == 2


def test_a_job_only_counts_in_the_pools_its_type_runs_on() -> None:
    servers = {"v100": [(0, 4)], "k80": [(4, 4)]}
    assert usable_idle_gpus(servers, [WaitingClass(1, ("v100",), 3)]) == 0
    assert usable_idle_gpus(servers, [WaitingClass(1, ("v100", "k80"), 3)]) == 3


def test_largest_gangs_are_placed_first_best_fit() -> None:
    # A 2-GPU job best-fits the server with 2 free, leaving the 3 for the 3-GPU job.
    servers = {"p100": [(3, 4), (2, 4)]}
    waiting = [WaitingClass(2, ("p100",), 1), WaitingClass(3, ("p100",), 1)]
    assert usable_idle_gpus(servers, waiting) == 5


def test_a_gang_larger_than_a_server_needs_whole_idle_servers_of_one_pool() -> None:
    waiting = [WaitingClass(8, ("k80", "v100"), 1)]
    assert usable_idle_gpus({"k80": [(4, 4), (3, 4)], "v100": [(4, 4)]}, waiting) == 0
    assert usable_idle_gpus({"k80": [(4, 4), (4, 4), (4, 4)]}, waiting) == 8
