"""Runs of jobs on this node, as the executor tracks them between commands and exits."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode

from gfair.events.fields import JobRef
from gfair.events.jobs import JobSuspended
from gfair.events.reasons import SuspendReason
from gfair.node.lifecycle import ExitReport, SuspendResult
from gfair.sdk.checkpoint import checkpoint_bytes


class RunStatus(StrEnum):
    RUNNING = "running"
    # Stopped because the scheduler asked (suspend, migrate, drain, kill).
    STOPPED = "stopped"
    # Ended on its own: success, crash, or a stop request it did not honour.
    EXITED = "exited"
    # Yielded in place: its process waits in host memory, holding no GPU, to resume here.
    PARKED = "parked"
    # A prepared start: its process runs without GPUs until it parks in `Job.from_env()`.
    PREPARING = "preparing"


class StopKind(StrEnum):
    YIELD = "yield"  # checkpoint, then free the GPUs (suspend, migrate, drain)
    KILL = "kill"


@dataclass
class LocalJob:
    """One run: from the start that launched its process to that process's exit."""

    job: JobRef
    attempt: int
    gpu_indices: tuple[int, ...]
    generation: str
    started_at: float
    # The command that started this run: its redelivery re-announces the start.
    start_event_id: str
    correlation_id: str
    # The run's span (from launch to exit) in the trace the start command belonged to: its
    # reports (progress, checkpoints, exit) are published under it, in the job's trace.
    trace_context: Context
    span: Span | None = None
    status: RunStatus = RunStatus.RUNNING
    stop: StopKind | None = None
    # The command that asked for the stop: its redelivery restates the outcome.
    stop_event_id: str | None = None
    checkpoint_step: int | None = None
    # The checkpoint step this run resumed from; None for a fresh start.
    resumed_from: int | None = None
    # When the command that started this run's process arrived (wall time), and whether its
    # first progress report, which says how long to the first mini-batch, went out.
    commanded_at: float | None = None
    first_step_reported: bool = False
    # When its last progress report went out (monotonic), or None before the first of the
    # run or of its slice since an in-place resume.
    progress_sent_at: float | None = None
    # The grace its last yield had, when the scheduler set one (see `suspended`).
    yield_grace_s: float | None = None
    # Whether that yield came before the run's first mini-batch (see `suspended`).
    stopped_starting: bool = False
    # A prepared start's wait for its process to park (`RunControl.prepare`), until it ends.
    preparing: asyncio.Task[None] | None = None
    # Set by the report relay once the run's exit (its last report) has been published, or
    # recognised as the stop that was asked for.
    exit_handled: asyncio.Event = field(default_factory=asyncio.Event)
    # Says, where the run is kept, that its end was reported (`JobRunner.told`): else the next
    # executor of this node, should this one die first, reports it (`gfair.node.orphans`).
    told: Callable[[], None] = field(default=lambda: None, compare=False)

    @property
    def running(self) -> bool:
        return self.status is RunStatus.RUNNING

    @property
    def parked(self) -> bool:
        return self.status is RunStatus.PARKED

    @property
    def alive(self) -> bool:
        """Its process lives: running, parked in place, or a prepared start not yet parked."""
        return self.status in (RunStatus.RUNNING, RunStatus.PARKED, RunStatus.PREPARING)

    def end_span(self, ended: ExitReport) -> None:
        """Close the run's span with how it ended; later calls do nothing."""
        span, self.span = self.span, None
        if span is None:
            return
        if ended.yielded:
            end = "yielded" if self.stop is StopKind.YIELD else "drained"
        elif self.stop is StopKind.KILL and ended.terminated_by is not None:
            end = "killed"
        else:
            end = "completed" if ended.completed else "exited"
        span.set_attribute("gfair.run.end", end)
        span.set_attribute("gfair.steps", ended.steps)
        if ended.exit_code is not None:
            span.set_attribute("gfair.exit_code", ended.exit_code)
        if ended.signal is not None:
            span.set_attribute("gfair.signal", ended.signal)
        if self.checkpoint_step is not None:
            span.set_attribute("gfair.checkpoint_step", self.checkpoint_step)
        if end == "exited" and (ended.exit_code != 0 or ended.signal is not None):
            span.set_status(Status(StatusCode.ERROR, ended.reason or "the job process failed"))
        span.end(end_time=int(ended.time * 1e9))

    def suspended(
        self, node_id: str, reason: SuspendReason, result: SuspendResult | None
    ) -> JobSuspended:
        """`result` of the suspend that stopped it; None to restate what the run left."""
        step = self.checkpoint_step
        forced, overrun, in_place, size = False, None, self.parked, None
        if result is not None:
            in_place = result.parked
            if result.fresh and result.checkpoint is not None:
                size = checkpoint_bytes(result.checkpoint.path)
            step = result.checkpoint.step if result.checkpoint else None
            # Forced: it was signalled off its GPUs instead of yielding, so what it did since
            # `step` is lost; its owner reads why in `gfair job` and `gfair why`.
            forced = result.escalation is not None
            if forced and self.yield_grace_s is not None:
                overrun = max(0.0, result.switch_s - self.yield_grace_s)
        return JobSuspended(
            user=self.job.user,
            job_id=self.job.job_id,
            node_id=node_id,
            attempt=self.attempt,
            reason=reason,
            checkpoint_step=step,
            duration_s=result.switch_s if result is not None else None,
            forced=forced,
            overrun_s=overrun,
            in_place=in_place,
            checkpoint_bytes=size,
            starting=forced and self.stopped_starting,
        )


class RunTable:
    """The latest run of each job on this node."""

    def __init__(self) -> None:
        self._runs: dict[JobRef, LocalJob] = {}

    def get(self, job: JobRef) -> LocalJob | None:
        return self._runs.get(job)

    def put(self, run: LocalJob) -> None:
        self._runs[run.job] = run

    def all(self) -> list[LocalJob]:
        return list(self._runs.values())

    def running(self) -> list[LocalJob]:
        return [run for run in self._runs.values() if run.running]

    def parked(self) -> list[LocalJob]:
        return [run for run in self._runs.values() if run.parked]

    def alive(self) -> list[LocalJob]:
        return [run for run in self._runs.values() if run.alive]

    def busy_gpus(self) -> frozenset[int]:
        return frozenset(i for run in self.running() for i in run.gpu_indices)
