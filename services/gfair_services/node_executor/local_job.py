"""One run of a job on this node, as the executor tracks it between commands and exits."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import StrEnum

from opentelemetry.context import Context

from gfair.events.fields import JobRef


class RunStatus(StrEnum):
    RUNNING = "running"
    # Stopped because the scheduler asked (suspend, migrate, drain, kill).
    STOPPED = "stopped"
    # Ended on its own: success, crash, or a stop request it did not honour.
    EXITED = "exited"


class StopKind(StrEnum):
    YIELD = "yield"  # checkpoint, then free the GPUs (suspend, migrate, drain)
    KILL = "kill"


@dataclass
class LocalJob:
    job: JobRef
    attempt: int
    gpu_indices: tuple[int, ...]
    generation: str
    started_at: float
    # The command that started this run: its redelivery re-announces the start.
    start_event_id: str
    correlation_id: str
    # The trace the start command belonged to, so this run's reports join the job's trace.
    trace_context: Context
    status: RunStatus = RunStatus.RUNNING
    stop: StopKind | None = None
    # The command that asked for the stop: its redelivery restates the outcome.
    stop_event_id: str | None = None
    checkpoint_step: int | None = None
    # The checkpoint step this run resumed from; None for a fresh start.
    resumed_from: int | None = None
    # Set by the event relay once the run's exit (its last event) has been published or
    # recognised as the stop that was asked for.
    exit_handled: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def running(self) -> bool:
        return self.status is RunStatus.RUNNING
