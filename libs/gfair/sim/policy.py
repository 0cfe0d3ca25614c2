"""What the simulator asks of a scheduling policy.

Jobs are submitted (and admitted, or rejected with the reason: `Admission`) and finished with
the virtual time, measured rates are reported back, and once per quantum the policy says which
jobs hold GPUs on which server. The simulator executes that decision, charges
switching costs, tracks progress and tells the policy when jobs complete.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol, runtime_checkable

from gfair.sim.trace import TraceJob

__all__ = [
    "EVERY_QUANTUM",
    "UNTIL_NEXT_EVENT",
    "Admission",
    "Backfilling",
    "Policy",
    "PolicyDecision",
]

# `quiet_until` of a policy whose decision can change at any quantum.
EVERY_QUANTUM: Final = -math.inf
# `quiet_until` of a policy whose decision only changes when jobs arrive or finish.
UNTIL_NEXT_EVENT: Final = math.inf


@dataclass(frozen=True)
class Admission:
    """A policy's answer to a submission."""

    accepted: bool
    reason: str = ""  # why rejected, or which pools the job can use
    pool: str | None = None  # the fastest pool the job can use
    rule: str = ""  # the admission filter that refused, when rejected (`gfair.core.placement`)


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    """One quantum's decision.

    `runs` maps a server id to the jobs holding GPUs on it; a job listed on one server uses its
    requested GPUs there, a job listed on several servers holds all of their GPUs (gangs larger
    than a server take whole servers). Servers left out run nothing. `trades` counts trades the
    policy made since its previous decision.
    """

    runs: Mapping[str, tuple[str, ...]]
    trades: int = 0
    # Jobs the policy ended before this decision, and why (past their time limit); they fail.
    ended: Mapping[str, str] = field(default_factory=dict)


class Policy(Protocol):
    """A scheduler the simulator can drive. All times are virtual seconds."""

    @property
    def name(self) -> str: ...

    def submit(self, job: TraceJob, now: float) -> Admission: ...

    def finish(self, job_id: str, now: float) -> None: ...

    def observe(self, job_id: str, generation: str, rate: float, now: float) -> None:
        """A measured rate of `job_id` on `generation`, V100-seconds of work per second."""
        ...

    def plan(self, now: float) -> PolicyDecision: ...

    def quiet_until(self, now: float) -> float:
        """The earliest time the decision could change if no job arrives or finishes.

        `EVERY_QUANTUM` for time-slicing policies; `UNTIL_NEXT_EVENT` for run-to-completion
        ones. The simulator skips the quanta in between without asking, which is exact because
        the policy promised they would repeat the last decision.
        """
        ...


@runtime_checkable
class Backfilling(Protocol):
    """A policy that also fills GPUs between its decisions: when a job ends or arrives
    mid-quantum, `fill` names the waiting jobs to start now (job id -> servers) on GPUs that
    are idle; the jobs running keep running."""

    def fill(self, now: float) -> Mapping[str, tuple[str, ...]]: ...


@runtime_checkable
class LimitingArrays(Protocol):
    """A policy that keeps every job array within its limit itself (gandiva-fair's kernel does,
    in its snapshot). For any other the simulator admits at most `array_limit` of an array's
    members at a time, the next as one ends: the user's limit holds under every policy."""

    limits_arrays: bool
