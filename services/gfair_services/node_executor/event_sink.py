"""Where the executor's events go: a job's one at a time, under stable ids where possible.

Commands and the report relay publish a job's events through that job's lock, which is what
orders a run's events (see `executor`); other jobs' events go out beside them (their order
with each other, where it matters, comes from the order the commands run in: `executor`). An
event caused by a command gets an id derived from the command's, and one with a `key` (an
exit, a checkpoint, a drain) an id derived from the key, so doing it again publishes nothing
new: JetStream drops the repeated id.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypedDict, Unpack

import structlog
from opentelemetry import context as otel_context

from gfair.bus.metrics import export_from_zero, gfair_metrics
from gfair.bus.publisher import derived_event_id
from gfair.bus.runtime import ServiceRuntime
from gfair.events.envelope import Envelope, EventData
from gfair.events.fields import JobRef
from gfair.events.jobs import JobEvent
from gfair.events.reasons import MigrationReason, SuspendReason
from gfair_services.node_executor.local_job import LocalJob

_log = structlog.get_logger("gfair.services.node_executor")


def count_suspend(node_id: str, reason: SuspendReason) -> None:
    """A job this node checkpointed and stopped (counted once, where it happened)."""
    gfair_metrics().suspends.add(1, {"node": node_id, "reason": reason.value})


def count_migration(node_id: str, reason: MigrationReason) -> None:
    gfair_metrics().migrations.add(1, {"node": node_id, "reason": reason.value})


def count_from_zero(node_id: str) -> None:
    """This node's suspends and migrations, for every reason, exported at 0 from its start."""
    metrics = gfair_metrics()
    export_from_zero(
        metrics.suspends, ({"node": node_id, "reason": r.value} for r in SuspendReason)
    )
    export_from_zero(
        metrics.migrations, ({"node": node_id, "reason": r.value} for r in MigrationReason)
    )


class Reporting(TypedDict, total=False):
    """How `EventSink.send` publishes a report (see there)."""

    cause: Envelope | None
    key: str | None
    correlation_id: str | None
    traced: bool


class EventSink:
    def __init__(self) -> None:
        # A lock per job with its holders and waiters counted, let go when nobody needs it.
        self._locks: dict[JobRef | None, tuple[asyncio.Lock, int]] = {}
        self._sending = 0
        self._runtime: ServiceRuntime | None = None

    def bind(self, runtime: ServiceRuntime) -> None:
        self._runtime = runtime

    @property
    def busy(self) -> bool:
        """Whether an event is on its way to the broker now."""
        return self._sending > 0

    @asynccontextmanager
    async def holding(self, job: JobRef | None) -> AsyncIterator[None]:
        """The job's events held back (None: the node's own) while the caller changes its run
        and `send`s what it announces."""
        lock, users = self._locks.get(job) or (asyncio.Lock(), 0)
        self._locks[job] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[job]
            if users == 1:
                del self._locks[job]
            else:
                self._locks[job] = (lock, users - 1)

    async def publish(self, data: EventData, **how: Unpack[Reporting]) -> None:
        """`send`, holding the job's lock."""
        async with self.holding(data.job if isinstance(data, JobEvent) else None):
            await self.send(data, **how)

    async def publish_for(
        self, run: LocalJob | None, data: EventData, *, key: str | None = None, traced: bool = True
    ) -> None:
        """A report of `run`, in the trace and correlation of the command that started it
        (untraced: in its trace, without a span of its own)."""
        if run is None:
            await self.publish(data, key=key, traced=traced)
            return
        token = otel_context.attach(run.trace_context)
        try:
            await self.publish(data, key=key, correlation_id=run.correlation_id, traced=traced)
        finally:
            otel_context.detach(token)

    async def send(
        self,
        data: EventData,
        *,
        cause: Envelope | None = None,
        key: str | None = None,
        correlation_id: str | None = None,
        traced: bool = True,
    ) -> None:
        """Publish now; the caller holds the job's lock (`holding`)."""
        if self._runtime is None:
            raise RuntimeError("the node executor has not started")
        subject = data.subject()
        origin = cause.id if cause is not None else key
        # One event per (type, subject) per cause: the position needs no counting.
        event_id = derived_event_id(origin, 0, data.EVENT_TYPE, subject) if origin else None
        if cause is not None:
            correlation_id = cause.correlation_id or cause.id
        self._sending += 1
        try:
            # Under its id, a report the broker is too busy to acknowledge is published again
            # while the node runs: delayed (the job's later events wait behind it), never lost.
            await self._runtime.publisher.publish(
                data,
                event_id=event_id,
                causation=cause,
                correlation_id=correlation_id,
                traced=traced,
                persist=event_id is not None,
            )
        finally:
            self._sending -= 1
