"""Booking a quantum (`settle`): the credits and job passes the next snapshot carries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .cycle import EPS, Decision, RunnableJob, UserState

# How many quanta of entitlement a user may save up beyond its largest gang.
CREDIT_QUANTA = 8.0


def settle(
    users: Mapping[str, UserState],
    ran: Iterable[RunnableJob],
    decision: Decision,
    ceiling: Mapping[str, float],
    overrun: Mapping[str, Mapping[str, float]] | None = None,
    unheld: Mapping[str, Mapping[str, float]] | None = None,
) -> bool:
    """Book a quantum into the credits and job passes the next snapshot carries; return
    whether it was booked.

    First `overrun` (the snapshot's: GPU-quanta users' jobs held after they were told to let
    go) is charged, whether or not this quantum is booked: those GPUs were denied to whoever
    the earlier decision gave them, so a user whose jobs ignore their yields pays for every
    GPU-second they held, not for what the decisions said. Credits have no floor: the debt is
    worked off at the user's entitlement, while the others run. Likewise `unheld` (GPU-quanta
    the last booked decision charged for that the user's jobs did not hold, starting late) is
    given back: each GPU-second is charged once, to whoever held it. Without it the seconds a
    yielding gang still held were charged twice, to the gang's user as overrun and to the user
    the decision gave them, and a small user beside whole-server gangs received two thirds of
    its share at 3 s quanta.

    Each user's credit in each pool grows by its entitlement and falls by what it was charged,
    capped at ``max(ceiling[user], CREDIT_QUANTA * entitlement) + entitlement`` so that share a
    user cannot use (no job of its fits that pool) does not pile up into a later monopoly;
    `ceiling` is the user's largest gang, which a waiting gang must be able to save up for. Each
    job that ran (`ran`, the decision's jobs) advances its pass by its GPUs over its weight.
    Quanta in which no job waits are not booked: nobody was denied anything.
    """
    for corrections, sign in ((overrun, -1.0), (unheld, 1.0)):
        for name, held in (corrections or {}).items():
            owner = users.get(name)
            if owner is None:
                continue  # gone with its last job
            for generation, quanta in held.items():
                if generation in owner.credit:
                    owner.credit[generation] += sign * quanta
    if decision.waiting == 0:
        return False
    unusable = _unusable(users, decision)
    for name, user in users.items():
        spent = decision.charged.get(name, {})
        cap = ceiling.get(name, 1.0)
        for generation, entitled in user.entitled.items():
            owed = entitled - unusable.get((name, generation), 0.0)
            credit = user.credit.get(generation, 0.0) + owed - spent.get(generation, 0.0)
            user.credit[generation] = min(credit, max(cap, entitled * CREDIT_QUANTA) + entitled)
    for job in ran:
        job.pass_ += job.gpus / job.weight
    return True


def _unusable(users: Mapping[str, UserState], decision: Decision) -> dict[tuple[str, str], float]:
    """(user, pool) -> the part of the user's entitlement there that sat idle for want of a
    job of its that fits, while the user ran elsewhere: owed to nobody, so not saved up.

    A pool's GPUs left idle by a work-conserving decision fit no waiting job. A user short of
    its entitlement beside them that runs jobs this quantum was served as far as its jobs fit:
    its other gangs are too large for the holes (a 4-GPU gang beside another user's two 1-GPU
    jobs on a 4-GPU server), and nobody denied it those GPUs. Were that shortfall saved up,
    the gang's user would win the next quanta and push the small user's jobs off, and the two
    would alternate: the small user, whose demand lies below its share and which max-min
    fairness serves first, would receive half of it. A user that runs nothing still saves up:
    its gang waits for room that only its credit can clear (an 8-GPU gang beside a 4-GPU job).
    The idle GPUs are taken off the running users' shortfalls, in proportion to them.
    """
    unusable: dict[tuple[str, str], float] = {}
    for generation, idle in decision.idle.items():
        short = {}
        for name, user in users.items():
            spent = decision.charged.get(name, {}).get(generation, 0.0)
            gap = user.entitled.get(generation, 0.0) - spent
            if gap > EPS and name in decision.served:
                short[name] = gap
        total = sum(short.values())
        if total <= EPS:
            continue
        taken = min(float(idle), total)
        for name, gap in short.items():
            unusable[(name, generation)] = taken * gap / total
    return unusable
