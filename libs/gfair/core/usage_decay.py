"""Usage that decays with a half-life, and the fair-share weights it gives (docs/design.md §1.1).

A user's *decayed usage* is the GPU-seconds it received, each weighed by ``2^(-age / half_life)``:
`DecayedUsage` keeps it per user, charged as GPUs are held and decayed as time passes. An
account's decayed usage is its users' sum.

The decayed mode weighs usage against share at every level of the tree, as Slurm's fair-share
factor does: among the active children of an account (those `ShareTree.fill` divides its GPUs
among), child i with tickets ``t_i`` and decayed usage ``U_i`` has the weight

    w_i = t_i * 2 ** (-u_i / s_i),  s_i = t_i / sum(t),  u_i = U_i / sum(U)

(sums over the same active siblings; ``u_i = 0`` for every child while they have used nothing).
A child on its share (``u = s``) weighs half its tickets, one that used nothing all of them, one
that used twice its share a quarter: a user back from idling gets more than its instantaneous
share until its decayed usage has caught up, and with usage even the weights are the tickets'
proportions again. The weights then divide the account's GPUs by water-filling, capped by
demand, exactly as tickets do in the instantaneous mode.

The shares file's ``fairness = "decayed"`` turns it on (`ShareTree.decayed`); the drivers keep a
`DecayedUsage` and pass its usage in: the simulator's `gandiva-fair` policy from the GPUs its
jobs held, the trading auction from what split-stride's record counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TypeVar

K = TypeVar("K")


def fair_share_weights(tickets: Mapping[K, float], usage: Mapping[K, float]) -> dict[K, float]:
    """Each sibling's weight (module doc) from its tickets and decayed usage (missing: 0)."""
    total_tickets = sum(tickets.values())
    total_usage = sum(max(0.0, usage.get(key, 0.0)) for key in tickets)
    if total_usage <= 0 or total_tickets <= 0:
        return dict(tickets)
    weights: dict[K, float] = {}
    for key, held in tickets.items():
        share = held / total_tickets
        used = max(0.0, usage.get(key, 0.0)) / total_usage
        weights[key] = held * 2.0 ** (-used / share)
    return weights


class DecayedUsage:
    """Per-user GPU-seconds, each weighed by ``2^(-age / half_life_s)`` (module doc)."""

    def __init__(
        self, half_life_s: float, now: float = 0.0, usage: Mapping[str, float] | None = None
    ) -> None:
        """`usage`: user -> decayed GPU-seconds as of `now`, kept from before (none: zero)."""
        if not (math.isfinite(half_life_s) and half_life_s > 0):
            raise ValueError(f"half_life_s must be a finite number > 0, not {half_life_s!r}")
        self.half_life_s = half_life_s
        self.now = now
        self._usage: dict[str, float] = dict(usage or {})

    def advance(self, now: float) -> None:
        """Decay everything to `now` (earlier than the last time: nothing changes)."""
        elapsed = now - self.now
        if elapsed <= 0:
            return
        factor = 2.0 ** (-elapsed / self.half_life_s)
        self._usage = {user: used * factor for user, used in self._usage.items()}
        self.now = now

    def charge(self, user: str, gpus: float, seconds: float) -> None:
        """`user` held `gpus` GPUs for the `seconds` ending now: charged as if held evenly over
        them (the integral of the decay over the interval, not its end value)."""
        if gpus <= 0 or seconds <= 0:
            return
        rate = math.log(2) / self.half_life_s
        decayed = gpus * -math.expm1(-rate * seconds) / rate
        self._usage[user] = self._usage.get(user, 0.0) + decayed

    def usage(self) -> dict[str, float]:
        """User -> decayed GPU-seconds as of `now`."""
        return dict(self._usage)
