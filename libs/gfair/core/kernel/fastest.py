"""Rule 7: when nobody waits, the fastest pool to the jobs that gain most from it.

When every runnable job runs, the quantum is not booked (`settle`), so which pool each job runs
in is free: the fastest pool goes to the jobs that gain most from it over the slower ones, then
the next, a job's speed in a pool other than its own weighed by what a move there leaves of the
next quanta. Otherwise rule 1 decides, and on a cluster with few fast GPUs the earliest users
visited would hold them whether they gain 10x there or nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .affinity import affinity
from .cycle import EPS, Cycle, Pass, RunnableJob, fastest_for, prefer
from .cycle import own as own_servers
from .moves import HORIZON
from .statement import Statement


def fastest_to_fastest(cycle: Cycle) -> None:
    """Rule 7: when every runnable job runs, nobody is owed anything (`settle` books no quantum
    in which nobody waits), so each pool, fastest first, goes to the jobs that gain most from
    it over the slower pools, instead of to whoever the stride happened to visit there first.
    A job gaining nothing from a faster pool (it runs as fast or faster on a slower one) is
    not put there while a slower one has room. When the new assignment cannot hold every job
    (gangs and fragmentation), the decision stands. A job's speed in each pool is weighed by
    the part of the next quanta it runs there after moving (rule 8), so a job moves to a faster
    pool only when the gain repays the move."""
    pools, chosen, quantum_s = cycle.pools, cycle.chosen, cycle.snapshot.quantum_s
    if len(pools) < 2:
        return
    pool_of = cycle.layout.generation
    statement = Statement(pools)
    target: dict[str, str] = {}  # job id -> the pool it goes to
    left = list(chosen.values())
    generations = [p.generation for p in pools]
    work = {c.job.id: _work(c.job, generations, pool_of, quantum_s) for c in left}
    for index, pool in enumerate(pools):
        gains = {c.job.id: _gain(work[c.job.id], index) for c in left}
        ranked = sorted(
            (c for c in left if gains[c.job.id] > 1 + EPS),
            key=lambda c: (-gains[c.job.id], c.pool != pool.generation, c.job.seq),
        )
        for choice in ranked:
            if statement.place(choice, pool.generation, prefer(choice.job)) is not None:
                target[choice.job.id] = pool.generation
        left = [c for c in left if c.job.id not in target]
    left.sort(key=lambda c: (-c.job.gpus, c.job.seq))
    for choice in left:  # no gain anywhere, or no room where it gains: the fastest that fits
        for pool in fastest_for(choice.job, pools):
            if statement.place(choice, pool.generation, prefer(choice.job)) is not None:
                target[choice.job.id] = pool.generation
                break
        if choice.job.id not in target:
            return
    for job_id, generation in target.items():
        if chosen[job_id].pool != generation:
            cycle.chosen_by[job_id] = Pass.FASTEST
    statement.commit(cycle)
    affinity(cycle)  # the same sets, packed to stay where they ran


def _work(
    job: RunnableJob, generations: Sequence[str], pool_of: Mapping[str, str], quantum_s: float
) -> list[float]:
    """What `job` does on each of `generations` over the next quanta, moves paid."""
    own = own_servers(job)
    lives = pool_of.get(own[0]) if own else None
    horizon = quantum_s * HORIZON
    speeds, move_s = job.speeds, job.move_s
    return [
        speeds.get(where, 0.0)
        * max(0.0, horizon - (0.0 if lives is None or lives == where else move_s))
        for where in generations
    ]


def _gain(work: Sequence[float], index: int) -> float:
    """How much more a job doing `work` (`_work`) does on pool `index` than on the best of the
    slower ones (inf when only here fits it, 0 when it does not fit here)."""
    here = work[index]
    rest = max(work[index + 1 :], default=0.0)
    if here <= 0:
        return 0.0
    return here / rest if rest > 0 else float("inf")
