"""Rule 5: where on the pool.

A job stays on the servers it ran on when they still have room, else returns to the servers
holding its checkpoint, else goes best-fit (the fullest server with room, so whole servers stay
free for gangs); a gang larger than a server takes whole idle servers. The selected set is
packed again with that preference after selection (`affinity`); when the affinity packing
cannot hold the set, the selection's own packing stands. A gang that does not fit because jobs
that stay put leave every server partly free gets the server cheapest to clear: its jobs move
to the others' free GPUs (`fits`), rather than GPUs idle.
"""

from __future__ import annotations

import operator

from .cycle import Choice, Cycle, PoolState, prefer
from .statement import Statement

# Times per pool and quantum the chosen jobs may be packed again to make room for a gang, and
# the most chosen jobs a pool may have for it (each repack places them all again).
REPACKS = 2
_REPACK_JOBS = 512
_ARRIVAL = operator.attrgetter("job.seq")
_SIZE = operator.attrgetter("job.gpus")


def fits(pool: PoolState, gpus: int, cycle: Cycle, repacks: dict[str, int]) -> bool:
    """Whether a job of `gpus` fits the pool now, packing the pool's chosen jobs again,
    largest first, when the free GPUs suffice but are scattered (at most `REPACKS` times per
    pool and quantum, and only in pools running at most `_REPACK_JOBS` jobs, to bound a
    quantum's cost): greedy packing in priority order leaves holes a gang cannot use. The
    chosen jobs keep their servers where that leaves room; where it does not (jobs that ran
    spread over several servers each hold part of one), the jobs of the server that is
    cheapest to clear move to the others' free GPUs, rather than the scattered GPUs idle."""
    generation = pool.generation
    room = cycle.packing[generation]
    if room.fits(gpus):
        return True
    if room.total < gpus or repacks[generation] <= 0:
        return False
    repacks[generation] -= 1
    members = [c for c in cycle.chosen.values() if c.pool == generation]
    if len(members) > _REPACK_JOBS:
        return False
    members.sort(key=lambda c: (-c.job.gpus, not c.job.running, c.job.seq))
    statement = Statement((pool,))
    for choice in members:
        if statement.place(choice, generation, prefer(choice.job)) is None:
            return False
    if not statement.rooms[generation].fits(gpus):
        cleared = _clear_a_server(pool, gpus, statement.placed)
        if cleared is None:
            return False
        statement = cleared
    statement.commit(cycle)
    return True


def _clear_a_server(
    pool: PoolState, gpus: int, placed: list[tuple[Choice, str, tuple[str, ...]]]
) -> Statement | None:
    """A packing of `placed` that leaves one server of at least `gpus` GPUs empty, moving only
    the one-server jobs on it (the server holding the fewest GPUs that can so be cleared); or
    None. Gangs larger than a server are not helped: they need several servers cleared."""
    generation = pool.generation
    held: dict[str, int] = {server.id: 0 for server in pool.servers}
    spanning: set[str] = set()
    for choice, _, servers in placed:
        if len(servers) > 1:
            spanning.update(servers)
        else:
            held[servers[0]] += choice.job.gpus
    candidates = sorted(
        (s for s in pool.servers if s.gpus >= gpus and s.id not in spanning),
        key=lambda s: (held[s.id], s.id),
    )
    for target in candidates:
        statement = Statement((pool,))
        room = statement.rooms[generation]
        room.place(target.gpus, ((target.id,),))  # kept empty while the others are packed
        moving = [c for c, _, servers in placed if target.id in servers]
        for choice, _, servers in placed:
            if target.id not in servers:
                statement.keep(choice, generation, servers)
        moved = [statement.place(c, generation, ()) for c in moving]
        if all(servers is not None for servers in moved):
            room.release((target.id,), target.gpus)
            return statement
    return None


def affinity(cycle: Cycle) -> None:
    """Rule 5: pack each pool's chosen jobs again, staying where they ran when possible."""
    members: dict[str, list[Choice]] = {p.generation: [] for p in cycle.pools}
    for choice in cycle.chosen.values():
        members[choice.pool].append(choice)
    for pool in cycle.pools:
        generation = pool.generation
        statement = Statement((pool,))
        # Jobs that stay come first, then those going back to their checkpoint's servers,
        # then the rest (jobs coming from another pool among them: they have no place here to
        # keep, and placed first they would take the place of a job that stays), largest
        # gangs first (they are the hardest to fit), then by arrival.
        here = statement.rooms[generation].size
        parts: tuple[list[Choice], ...] = ([], [], [], [])
        for choice in members[generation]:
            running, home = choice.job.running, choice.job.home
            stays = bool(running) and running[0] in here
            returns = bool(home) and home[0] in here
            parts[(0 if stays else 2) + (0 if returns else 1)].append(choice)
        place = statement.place
        for part in parts:
            part.sort(key=_ARRIVAL)
            part.sort(key=_SIZE, reverse=True)  # stable: equal sizes stay in arrival order
            for choice in part:
                job = choice.job
                if place(choice, generation, (job.running, job.home)) is None:
                    break
            else:
                continue
            break
        else:
            statement.commit(cycle)
