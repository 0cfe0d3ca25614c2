"""Rule 4: fast GPUs first.

Idle GPUs of a faster pool take jobs from slower pools that run faster there (largest gain
first), when the speed gained over the next quanta repays the move (rule 8): nobody else wanted
them this quantum. What such moves free in the slower pools goes through rule 3 again (a gang
may now fit there).
"""

from __future__ import annotations

from .cycle import EPS, Choice, Cycle, Pass, own, prefer
from .moves import HORIZON, pays, switch_s


def fast_first(cycle: Cycle) -> bool:
    """Rule 4: idle GPUs of a faster pool take the jobs that gain most from moving there, when
    the gain over the next quanta exceeds what moving costs them beyond where they were put
    (rule 8). Returns whether any job moved."""
    packing, chosen, quantum_s = cycle.packing, cycle.chosen, cycle.snapshot.quantum_s
    moved = False
    for target in cycle.pools:
        room = packing[target.generation]
        if room.total == 0:
            continue
        candidates: list[tuple[float, int, Choice]] = []
        for choice in chosen.values():
            job = choice.job
            if choice.pool == target.generation or job.gpus > room.total:
                continue
            here, there = job.speeds.get(choice.pool, 0.0), job.speeds.get(target.generation, 0.0)
            if there > here * (1 + EPS) and pays(
                (there / here - 1) * quantum_s * HORIZON,
                (job.move_s if own(job) else 0.0) - switch_s(job, choice.servers),
            ):
                candidates.append((-there / here, job.seq, choice))
        candidates.sort(key=lambda c: (c[0], c[1]))
        for _, _, choice in candidates:
            if room.total == 0:
                break
            placed = room.place(choice.job.gpus, prefer(choice.job))
            if placed is not None:
                packing[choice.pool].release(choice.servers, choice.job.gpus)
                choice.pool, choice.servers = target.generation, placed
                cycle.chosen_by[choice.job.id] = Pass.FAST_FIRST
                moved = True
    return moved
