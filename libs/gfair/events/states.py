"""Lifecycle states of jobs and nodes, as the events move them.

Each lifecycle event class names the state it leads to (`JOB_STATE`, `NODE_STATE`), so a service
folding events into records needs no second copy of the state machine.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    SUBMITTED = "submitted"
    # Admitted, waiting for the jobs it depends on to complete (`after_ok`); not yet runnable.
    HELD = "held"
    # Admitted and waiting for GPUs (also between retries).
    QUEUED = "queued"
    PLACED = "placed"
    RUNNING = "running"
    # Checkpointed and off its GPUs, waiting for its next quantum.
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL_JOB_STATES


_TERMINAL_JOB_STATES = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED}
)


class NodeState(StrEnum):
    READY = "ready"
    # Missed heartbeats: no new work goes there, running work is not yet re-placed.
    SUSPECTED = "suspected"
    FAILED = "failed"
    # Kept failing jobs: no work until an operator uncordons it.
    QUARANTINED = "quarantined"
