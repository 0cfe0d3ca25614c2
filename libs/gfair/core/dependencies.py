"""Dependencies between jobs: held until others complete (Slurm's ``--dependency=afterok``).

A job may name jobs of the same user (`after_ok`) that must each complete successfully before
it may run. `eligibility` decides, from what is known of each one's outcome:

- **ready** when every one of them completed (a dependency that completed before the job was
  submitted is satisfied at once);
- **doomed** when one of them failed, was cancelled or was rejected: it can never complete, so
  the job is cancelled, with that one named in the reason (Slurm's ``kill_invalid_depend``).
  Cancelling it is itself an outcome, so a chain of dependents is cancelled link by link;
- **unknown** when one of them is no job of the user's (refused at admission);
- **held** otherwise: it waits for those still running or queued.

A held job is not runnable: the drivers keep it out of the scheduler altogether (placement
admits it as `held` and announces it as accepted only when it becomes ready; the simulator
submits it to its policy only then), so it counts toward no demand and keeps no GPU idle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum


class DependencyOutcome(StrEnum):
    """What is known of a job another one depends on."""

    PENDING = "pending"  # not ended yet
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"


class Readiness(StrEnum):
    READY = "ready"
    HELD = "held"
    DOOMED = "doomed"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Eligibility:
    readiness: Readiness
    waiting_on: tuple[str, ...] = ()  # HELD: the dependencies not ended yet, in the job's order
    blocker: str | None = None  # DOOMED or UNKNOWN: the first dependency that decided it
    blocker_outcome: DependencyOutcome | None = None  # DOOMED: how that one ended

    @property
    def reason(self) -> str:
        """One line for the job's record and `gfair why`."""
        match self.readiness:
            case Readiness.READY:
                return "every job it depends on completed"
            case Readiness.HELD:
                return f"waiting for {', '.join(self.waiting_on)} to complete (after_ok)"
            case Readiness.DOOMED:
                return f"dependency {self.blocker} {self.blocker_outcome}: it can never complete"
            case _:
                return f"dependency {self.blocker} is no job of this user"


def eligibility(after_ok: Iterable[str], outcomes: Mapping[str, DependencyOutcome]) -> Eligibility:
    """Whether a job that depends on `after_ok` may run, from the known `outcomes` (module doc).

    `outcomes` maps the user's job ids to what is known of them; a job id absent from it is
    unknown. A failed dependency decides before an unknown one, and both before waiting.
    """
    deps = tuple(after_ok)
    failed = next(
        (
            d
            for d in deps
            if outcomes.get(d) not in (None, DependencyOutcome.PENDING, DependencyOutcome.COMPLETED)
        ),
        None,
    )
    if failed is not None:
        return Eligibility(Readiness.DOOMED, blocker=failed, blocker_outcome=outcomes[failed])
    unknown = next((d for d in deps if d not in outcomes), None)
    if unknown is not None:
        return Eligibility(Readiness.UNKNOWN, blocker=unknown)
    waiting = tuple(d for d in deps if outcomes[d] is DependencyOutcome.PENDING)
    if waiting:
        return Eligibility(Readiness.HELD, waiting_on=waiting)
    return Eligibility(Readiness.READY)
