"""Rule 6: between quanta (`backfill`).

When a job ends or arrives mid-quantum, the GPUs left idle go to waiting jobs by rule 3 at once,
the running jobs staying where they are; the next quantum's decision then starts from them as
from any running job.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

from gfair.core.packing import Packing

from .cycle import Choice, Cycle, RunnableJob, Snapshot
from .surplus import surplus_runs

_WHERE_RUNNING = operator.attrgetter("running", "id")
# Stands for every running job `backfill` leaves where it is (only whether one is chosen is read).
_RUNNING = Choice(RunnableJob("", "", 0, 0, {}), "", ())


def backfill(snapshot: Snapshot, holding: Iterable[RunnableJob]) -> dict[str, tuple[str, ...]]:
    """Between decisions (a job ended, or arrived, mid-quantum): the GPUs that `holding` (the
    jobs running, on their `running` servers) leave idle go to waiting jobs by rule 3, so no
    GPU idles until the next quantum while a job that fits waits. Running jobs stay where they
    are; nothing is charged (as for any surplus). Returns the placements of the jobs that start.
    """
    cycle = Cycle(snapshot, empty=False)
    holding = list(holding)
    held = _held_in_place(cycle, holding)
    if held is None:
        cycle.packing, cycle.chosen = _held_in_order(cycle, holding)
    else:
        cycle.packing, running_ids = held
        # Running jobs keep their servers, and `surplus_runs` without repacks only asks
        # whether a job is chosen: one placeholder stands for all of them.
        cycle.chosen = dict.fromkeys(running_ids, _RUNNING)
    running = set(cycle.chosen)
    surplus_runs(cycle, repack=False)
    return {job_id: c.servers for job_id, c in cycle.chosen.items() if job_id not in running}


def _held_in_order(
    cycle: Cycle, holding: list[RunnableJob]
) -> tuple[dict[str, Packing], dict[str, Choice]]:
    """The pools' free GPUs once `holding` is placed on its servers one job at a time, and
    the jobs placed. In an order of the kernel's own: best fit picks among equally free servers
    by the order they became so, and the drivers hold their running jobs in orders of their
    own. A job whose servers are taken is placed elsewhere, as any."""
    packing = {p.generation: p.empty() for p in cycle.pools}
    pool_of = cycle.layout.generation
    chosen: dict[str, Choice] = {}
    for job in sorted(holding, key=_WHERE_RUNNING):
        pool = pool_of.get(job.running[0]) if job.running else None
        if pool is None:
            continue
        servers = packing[pool].place(job.gpus, (job.running,))
        if servers is not None:
            chosen[job.id] = Choice(job, pool, servers)
    return packing, chosen


def _held_in_place(
    cycle: Cycle, holding: list[RunnableJob]
) -> tuple[dict[str, Packing], list[str]] | None:
    """What `_held_in_order` gives, without sorting and placing every running job, when every
    job fits where it runs (a consistent cluster: the drivers never start a job on GPUs still
    held): the GPUs taken on each server, and each server's place among equally free ones
    from the last job, in that order, to take its GPUs. None when some job does not fit where
    it runs (`_held_in_order` then says where it goes)."""
    pool_of, size = cycle.layout.generation, cycle.layout.size
    taken: dict[str, int] = {}
    gangs: dict[str, tuple[str, ...]] = {}  # server -> the gang holding it whole
    placed: list[str] = []
    for job in holding:
        running = job.running
        if not running:
            continue
        pool = pool_of.get(running[0])
        if pool is None:
            continue
        if len(running) == 1:
            server = running[0]
            if server in gangs:
                return None
            now = taken.get(server, 0) + job.gpus
            if now > size[server]:
                return None
            taken[server] = now
        else:
            for server in running:
                if pool_of.get(server) != pool or server in taken:
                    return None
                taken[server] = size[server]
                gangs[server] = running
            if sum(map(size.__getitem__, running)) < job.gpus:
                return None
        placed.append(job.id)

    def last_taken(server: str) -> tuple[tuple[str, ...], int]:
        # `_held_in_order` places by (servers, id): a server is last taken by its own jobs, or
        # by the gang holding it, whose servers are taken in their order.
        gang = gangs.get(server)
        return (gang, gang.index(server)) if gang is not None else ((server,), 0)

    packing = {p.generation: p.empty() for p in cycle.pools}
    for server in sorted(taken, key=last_taken):
        packing[pool_of[server]].take(server, taken[server])
    return packing, placed
