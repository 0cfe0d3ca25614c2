"""What the supervisor reports about a job's life; the node executor turns these into events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gfair.node.launch import CheckpointRef
from gfair.sdk.environment import YIELD_EXIT_CODE

Escalation = Literal["SIGTERM", "SIGKILL"]


@dataclass(frozen=True, slots=True)
class ProgressReport:
    """Emitted at most every `progress_interval_s` per job while it reports mini-batches.

    `steps` counts mini-batches done (including those before the resumed checkpoint);
    `rate_per_s` is mini-batches per second over the last `window_s` (None until two reports).
    """

    job_id: str
    attempt: int
    time: float
    steps: int
    rate_per_s: float | None
    window_s: float
    checkpoint_step: int | None
    # When this run's first mini-batch ended (wall time): how long its start took to pay off.
    first_step_at: float | None = None


@dataclass(frozen=True, slots=True)
class CheckpointReport:
    job_id: str
    attempt: int
    time: float
    checkpoint: CheckpointRef


@dataclass(frozen=True, slots=True)
class ExitReport:
    """The job's process group leader exited (stragglers in its group are killed then).

    `signal` is set when a signal ended it (then `exit_code` is None). `yielded` is true when it
    exited because it was asked to give its GPUs back; `completed` when the SDK said training
    finished. `terminated_by` says whether the supervisor had to signal it (suspend timeout or
    kill) and `reason` why. `checkpoint` is the newest valid checkpoint after the exit.
    """

    job_id: str
    attempt: int
    time: float
    exit_code: int | None
    signal: int | None
    duration_s: float
    stderr_tail: str
    yielded: bool
    completed: bool
    terminated_by: Escalation | None
    reason: str | None
    steps: int
    checkpoint: CheckpointRef | None


def exit_was_yield(
    *,
    requested: bool,
    completed: bool,
    exit_code: int | None,
    forced: bool,
    reported: bool = False,
) -> bool:
    """Whether a run's exit gave its GPUs back as asked (`ExitReport.yielded`): a yield was
    requested, training did not finish, and the job said it yielded (`reported`), exited
    cleanly or with the SDK's yield code, or was forced off its GPUs."""
    return requested and not completed and (reported or exit_code in (0, YIELD_EXIT_CODE) or forced)


JobEvent = ProgressReport | CheckpointReport | ExitReport


@dataclass(frozen=True, slots=True)
class SuspendResult:
    """Outcome of a suspend: which checkpoint a resume will start from, and what it cost.

    `fresh` is true when the job wrote a checkpoint after it was asked to yield; false means the
    current checkpoint is an older fallback (or there is none: resume restarts from step 0).
    `switch_s` runs from the request to the process being gone, or, `parked` (it yielded in
    place: its process waits in host memory, its GPUs free, and `exited` is None), to its
    saying so.
    """

    job_id: str
    checkpoint: CheckpointRef | None
    fresh: bool
    escalation: Escalation | None
    switch_s: float
    exited: ExitReport | None
    parked: bool = False

    @property
    def exit(self) -> ExitReport:
        """How the process ended (not for a `parked` result: it did not)."""
        if self.exited is None:
            raise ValueError(f"job {self.job_id} parked in place: its process did not exit")
        return self.exited


@dataclass(frozen=True, slots=True)
class ParkedJob:
    """A job parked in place: since when (monotonic clock) and how much host memory it holds."""

    job_id: str
    gpu_indices: tuple[int, ...]
    since: float
    rss_bytes: int
