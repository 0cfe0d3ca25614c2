"""What it costs a job to change hands: the seconds of progress a resume or a move loses.

A job suspended at the end of a quantum resumes on the servers it left by restoring its
checkpoint in place (`resume_s`; the suspend's own checkpoint is folded in). Started on other
servers, in its pool or another, it pays `migration_s` instead: the checkpoint written and read
over the network, a new process, CUDA initialised again. A first start costs nothing extra (its
start-up is part of its run time), and a job that keeps running where it ran pays nothing.

The defaults are Gandiva's measurements (0.1-1 s and 1-2 s, rounded up). A real cluster's moves
cost tens of seconds to minutes, which is what the kernel weighs each move against
(`gfair.core.kernel`): every job carries its own costs in the snapshot, filled from
`DEFAULT_COSTS` unless a run or the job says otherwise. In the live cluster a job's nodes
measure its switches and the profiler estimates them (`MeasuredSwitches`); split-stride charges
the job from those once measured, a move never below the operator's cost (`charged`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class SwitchCosts:
    """Seconds of progress a job loses resuming in place (`resume_s`) and starting on other
    servers than it left (`migration_s`)."""

    resume_s: float = 0.5
    migration_s: float = 3.0

    def __post_init__(self) -> None:
        if not (self.resume_s >= 0 and self.migration_s >= 0):
            raise ValueError("switching costs must be >= 0 s")


DEFAULT_COSTS: Final = SwitchCosts()


@dataclass(frozen=True, slots=True)
class MeasuredSwitches:
    """What a job's own switches took, as its nodes measured them (None: not measured yet).

    `yield_s`: from a suspend command to its GPUs free; `resume_in_place_s`: from a resume
    command to the first new mini-batch of its process parked in place; `cold_start_s`: from a
    start command to a new process's first mini-batch (a start from a checkpoint).
    """

    yield_s: float | None = None
    resume_in_place_s: float | None = None
    cold_start_s: float | None = None

    def charged(self, operator: SwitchCosts, *, parked: bool) -> SwitchCosts:
        """The costs the kernel weighs for the job: a resume is its yield and then its resume,
        in place when its process is `parked` there, else a new process from its checkpoint; a
        move is its yield and a new process, but never less than the operator's migration cost,
        which stands for what no node measures (the checkpoint crossing the network, a cold
        cache on another server). Each falls back to the operator's until both its parts were
        measured."""
        restart = self.resume_in_place_s if parked else self.cold_start_s
        resume_s = operator.resume_s
        migration_s = operator.migration_s
        if self.yield_s is not None:
            if restart is not None:
                resume_s = self.yield_s + restart
            if self.cold_start_s is not None:
                migration_s = max(operator.migration_s, self.yield_s + self.cold_start_s)
        return SwitchCosts(resume_s=resume_s, migration_s=migration_s)
