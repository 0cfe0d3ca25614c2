"""What it costs a job to change hands: the seconds of progress a resume or a move loses.

A job suspended at the end of a quantum resumes on the servers it left by restoring its
checkpoint in place (`resume_s`; the suspend's own checkpoint is folded in). Started on other
servers, in its pool or another, it pays `migration_s` instead: the checkpoint written and read
over the network, a new process, CUDA initialised again. A first start costs nothing extra (its
start-up is part of its run time), and a job that keeps running where it ran pays nothing.

The defaults are Gandiva's measurements (0.1-1 s and 1-2 s, rounded up). A real cluster's moves
cost tens of seconds to minutes, which is what the kernel weighs each move against
(`gfair.core.kernel`): every job carries its own costs in the snapshot, filled from
`DEFAULT_COSTS` unless a run or the job says otherwise.
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
