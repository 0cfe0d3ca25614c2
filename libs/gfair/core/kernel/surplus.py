"""Rule 3: work conservation (surplus).

GPUs left after every entitled user ran what it could go to the waiting jobs, most-owed users
first, each on the fastest pool where it fits: first the jobs that start without moving, then
those whose servers are taken (whatever their move costs: waiting beside idle GPUs gains
nothing). Surplus is not charged: it is capacity the pool's own users left.
"""

from __future__ import annotations

import itertools
import operator

from .affinity import REPACKS, fits
from .cycle import (
    EPS,
    ID,
    TOTAL,
    Choice,
    Cycle,
    Pass,
    PoolState,
    RunnableJob,
    fastest_for,
    prefer,
    priority,
)
from .cycle import own as own_servers
from .stride import SCAN_LIMIT


def surplus_runs(cycle: Cycle, *, repack: bool = True) -> None:
    """Rule 3: idle GPUs to waiting jobs, most-owed users first, fastest fitting pool (without
    `repack`, chosen jobs keep their servers: they are running)."""
    snapshot, pools, packing, chosen = cycle.snapshot, cycle.pools, cycle.packing, cycle.chosen
    order, charged = cycle.order, cycle.charged
    if all(packing[p.generation].total == 0 for p in pools):
        return
    repacks = dict.fromkeys(packing, REPACKS if repack else 0)

    def owed(user: str) -> tuple[float, int]:
        state = snapshot.users[user]
        entitled = sum(state.entitled.values())
        if entitled <= EPS:
            return (0.0, state.seq)
        credit = sum(state.credit.values()) - sum(charged.get(user, {}).values())
        return (-priority(credit, entitled), state.seq)

    # Only users with a job still waiting, in most-owed order. Jobs that start without moving
    # (that never ran, or whose servers are free) go first; those whose servers are taken
    # then take what is left.
    pool_of = cycle.layout.state
    # user -> its first job not chosen (C iterators: the chosen ones before it are many)
    first: dict[str, int] = {}
    for user, jobs in order.items():
        unchosen = map(operator.not_, map(chosen.__contains__, map(ID, jobs)))
        index = next(itertools.compress(itertools.count(), unchosen), None)
        if index is not None:
            first[user] = index
    movers: list[RunnableJob] = []
    # The most GPUs free in any pool: a job of more starts nowhere, and `_start_fastest` is
    # spared (it would look at each pool and leave everything as it was).
    most = max(map(TOTAL, packing.values()))
    fastest: dict[int, list[PoolState]] = {}  # `_fastest_for` by speeds (shared by many jobs)
    for user in sorted(first, key=owed):
        scanned = 0
        for job in itertools.islice(order[user], first[user], None):
            if job.id in chosen:
                continue
            scanned += 1
            if scanned > SCAN_LIMIT:
                break
            own = own_servers(job)
            home = pool_of.get(own[0]) if own else None
            if home is None:
                if job.gpus <= most:
                    _start_fastest(job, cycle, repacks, fastest)
                    most = max(map(TOTAL, packing.values()))
            elif job.speeds.get(home.generation, 0.0) > 0 and packing[home.generation].free_for(
                own, job.gpus
            ):
                packing[home.generation].place(job.gpus, (own,))
                cycle.choose(Choice(job, home.generation, own), Pass.SURPLUS)
                most = max(map(TOTAL, packing.values()))
            else:
                movers.append(job)
        if most == 0:
            return
    # Whatever a move costs, a job that waits gains nothing while GPUs it fits idle: with
    # quanta shorter than a move (a live cluster at 3 s) it would otherwise never start.
    for job in movers:
        if job.gpus <= most:
            _start_fastest(job, cycle, repacks, fastest)
            most = max(map(TOTAL, packing.values()))
            if most == 0:
                return


def _start_fastest(
    job: RunnableJob, cycle: Cycle, repacks: dict[str, int], fastest: dict[int, list[PoolState]]
) -> None:
    """Start `job` on the fastest pool with room for it, if any. `fastest`: `_fastest_for`
    of the speeds seen so far in this decision, by identity (jobs of a type share them)."""
    order = fastest.get(id(job.speeds))
    if order is None:
        order = fastest[id(job.speeds)] = fastest_for(job, cycle.pools)
    packing = cycle.packing
    gpus = job.gpus
    for pool in order:
        # Fewer GPUs free than it asks: it does not fit, and `_fits` would change nothing.
        if gpus > packing[pool.generation].total or not fits(pool, gpus, cycle, repacks):
            continue
        servers = packing[pool.generation].place(gpus, prefer(job))
        if servers is not None:
            cycle.choose(Choice(job, pool.generation, servers), Pass.SURPLUS)
            return
