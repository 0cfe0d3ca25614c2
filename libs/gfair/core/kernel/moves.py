"""Rule 8: moves only when they pay.

Every job carries its own switch costs (`RunnableJob.move_s`, `resume_s`;
`gfair.core.switch_costs`) and the snapshot the quantum's length. A job that ran or has a
checkpoint moves to other servers or another pool only when what it gains over the next quanta
exceeds its move cost: a faster generation (`HORIZON` quanta at the speed ratio, rules 4 and 7),
GPUs that would otherwise idle (rule 3, always), or its user's share of a pool it cannot collect
where it is: the user must be owed there, beyond what it is owed where the job lives,
`gpus * c * min(_PATIENCE * c, _MOST_PATIENCE)` GPU-quanta for a move costing c of a quantum
(`owed_enough`), or, for a job whose own servers are taken, have saved up all `settle` lets it;
but a user asking for no more GPUs than its share can never spend what it saves (it cannot run
more than all its jobs), so its waiting job moves once its credit there covers the move,
`gpus * c` (beyond what it is owed where the job lives): what waiting has lost it then equals
what moving costs (ski rental). Cheap moves (Gandiva's 3 s of a 360 s quantum) are made about as
soon as a user is owed a pool's share, dear ones (a minute or two) only once that share is worth
many of them; and a job that moved for its share stays until its user is owed as much again
elsewhere, so nothing bounces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .cycle import EPS, RunnableJob, UserState
from .settling import CREDIT_QUANTA

# Quanta over which a move's gain is counted against its cost: a job moved to a faster pool
# runs there for at least the quantum it moved in, and usually the next ones too.
HORIZON = 2.0
# How many times a move's cost its user must be owed in the pool it would move to, for its
# share there to repay the move: `_PATIENCE` times the move's cost as a part of a quantum, at
# most `_MOST_PATIENCE`. A move displaces a job that lives there, and a dear one is not undone
# cheaply, so the dearer a move the more times over it must be repaid. Tuned on the comparison
# workloads (docs/benchmarks.md): 3 s of 360 s moves as soon as owed, 60 s moves only for 3.3
# GPU-quanta owed (more than a one-job user on a busy cluster ever saves up).
_PATIENCE = 120.0
_MOST_PATIENCE = 20.0


def switch_s(job: RunnableJob, servers: tuple[str, ...]) -> float:
    """Seconds of progress the job loses running on `servers` this quantum."""
    if job.running:
        return 0.0 if servers == job.running else job.move_s
    if job.home:
        return job.resume_s if servers == job.home else job.move_s
    return 0.0  # a first start: its start-up is part of its run time


def pays(gain_s: float, cost_s: float) -> bool:
    """A move is made when what it gains, in seconds of the job's progress over the next
    quanta, exceeds the seconds it loses moving."""
    return gain_s > cost_s + EPS


def charge(
    job: RunnableJob, state: UserState, spent: Mapping[str, float], turn: str, where: str
) -> str:
    """The pool a job run on the turn of its user's entry in `turn` is charged in (its GPUs):
    where it runs, while its user is still owed there (credit left after what it was charged
    so far this quantum); else the turn's pool.

    Without it, a user whose share is split among pools runs its job wherever its credit is
    highest, and running there makes another pool's higher next quantum: the job moved every
    quantum (a checkpoint and restore each time), and live, each move waits for its old node
    to confirm the stop and its new one to clear the GPUs, so an owed user spent its quanta
    moving instead of running. Charged where it runs while owed there, and in the turn's pool
    after that, it runs where it is and its user's share of every pool still reaches it."""
    if where == turn:
        return turn
    if (
        state.entitled.get(where, 0.0) > EPS
        and state.credit.get(where, 0.0) - spent.get(where, 0.0) > EPS
    ):
        return where
    return turn


def owed_enough(
    job: RunnableJob,
    state: UserState,
    spent: Mapping[str, float],
    generation: str,
    lives: str,
    quantum_s: float,
    *,
    waits: bool,
    saves: bool,
) -> bool:
    """Whether the job's user is owed enough in `generation` for a move there to pay: its
    credit there, in GPU-seconds, exceeds `_PATIENCE` times what moving costs the job; or, for
    a job that `waits` (its own servers are taken), it has saved up all it may there
    (`settle`'s ceiling, at least), so that waiting longer would lose its share there; or, for
    a waiting job whose user `saves` nothing (`saves_up`: what it is owed is lost, not put by),
    its credit there covers the move's cost (beyond what it is owed where it lives), so that it
    has lost to waiting what moving costs."""
    entitled = state.entitled.get(generation, 0.0)
    credit = state.credit.get(generation, 0.0) - spent.get(generation, 0.0)
    cost = job.move_s / quantum_s  # of a quantum's progress
    needed = job.gpus * cost * min(_PATIENCE * cost, _MOST_PATIENCE)
    # Owed as much where it lives, it is as well off running there.
    at_home = 0.0 if generation == lives else state.credit.get(lives, 0.0) - spent.get(lives, 0.0)
    needed += max(0.0, at_home)
    if waits:
        needed = min(needed, max(float(job.gpus), entitled * CREDIT_QUANTA))
        if not saves:
            needed = min(needed, job.gpus * cost + max(0.0, at_home))
    return credit > EPS and credit >= needed - EPS


def saves_up(jobs: Sequence[RunnableJob], state: UserState) -> bool:
    """Whether the user's jobs ask for more GPUs than its share: only then can it spend later
    (running beyond its share while others' jobs wait) the credit it is owed while a job of it
    waits. Otherwise that credit is share lost: its jobs cannot run on more than they ask."""
    share = sum(state.entitled.values())
    asked = 0
    for job in jobs:
        asked += job.gpus
        if asked > share + EPS:
            return True
    return False
