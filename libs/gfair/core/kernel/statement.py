"""A tentative placement of chosen jobs, committed or discarded as one (Volcano's Statement).

Repacking a pool for a gang (`affinity.fits`), clearing a server for it, packing a pool again to
keep jobs where they ran (rule 5) and handing the pools to the jobs that gain most (rule 7) all
place a set of chosen jobs on empty pools, and keep the result only when every job found room:
a `Statement` holds those pools' packings and where each job went until `commit` makes them the
decision's, or is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable

from .cycle import Choice, Cycle, PoolState


class Statement:
    __slots__ = ("placed", "rooms")

    def __init__(self, pools: Iterable[PoolState]) -> None:
        self.rooms = {pool.generation: pool.empty() for pool in pools}
        self.placed: list[tuple[Choice, str, tuple[str, ...]]] = []

    def place(
        self, choice: Choice, generation: str, prefer: tuple[tuple[str, ...], ...]
    ) -> tuple[str, ...] | None:
        """Place the job in `generation`, preferring `prefer`; its servers, or None."""
        servers = self.rooms[generation].place(choice.job.gpus, prefer)
        if servers is not None:
            self.placed.append((choice, generation, servers))
        return servers

    def keep(self, choice: Choice, generation: str, servers: tuple[str, ...]) -> None:
        """Hold the job on `servers`, where it stays."""
        self.rooms[generation].place(choice.job.gpus, (servers,))
        self.placed.append((choice, generation, servers))

    def commit(self, cycle: Cycle) -> None:
        """Make the statement's placements and packings the decision's."""
        for choice, generation, servers in self.placed:
            choice.pool, choice.servers = generation, servers
        cycle.packing.update(self.rooms)
