"""Runs a `Service` on a bus: topology, one runner per handler worker, timers, graceful stop.

Stop (SIGTERM, SIGINT or `stop()`): no new fetches, in-flight handlers finish (publish their
outputs, ack), fetched-but-unstarted messages are handed back, timers end; the caller then
drains the connection (`Bus.close`). `abort()` instead cancels everything where it stands,
as a crash would, leaving unacknowledged messages to be redelivered.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from typing import Self

import structlog
from opentelemetry.trace import Tracer

from gfair.bus.history import HistoricalEvent, read_history
from gfair.bus.key_value import KeyValue
from gfair.bus.publisher import EventPublisher
from gfair.bus.runner import HandlerRunner, RunnerSettings
from gfair.bus.service import Service, Timer
from gfair.bus.topology import DEAD_LETTER_STREAM, Topology, dead_letter_stream
from gfair.bus.tracing import default_tracer
from gfair.bus.transport import Bus
from gfair.events.envelope import Envelope, EventData

_log = structlog.get_logger("gfair.bus.runtime")


class ServiceRuntime:
    def __init__(
        self,
        service: Service,
        bus: Bus,
        *,
        tracer: Tracer | None = None,
        settings: RunnerSettings | None = None,
        extra_topology: Topology | None = None,
    ) -> None:
        self._service = service
        self._bus = bus
        self._tracer = tracer or default_tracer()
        self._settings = settings or RunnerSettings()
        # Dead letters need somewhere to go before the first poison message arrives.
        self._topology = service.topology
        if all(s.name != DEAD_LETTER_STREAM for s in self._topology.streams):
            self._topology = self._topology.merge(Topology(streams=(dead_letter_stream(),)))
        if extra_topology is not None:
            self._topology = self._topology.merge(extra_topology)
        self._stopping = asyncio.Event()
        self._publisher = EventPublisher(
            bus, service.name, tracer=self._tracer, running=lambda: not self._stopping.is_set()
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._log = _log.bind(service=service.name)

    @property
    def bus(self) -> Bus:
        return self._bus

    @property
    def publisher(self) -> EventPublisher:
        """For events not caused by a handled one (ticks, heartbeats, tool commands)."""
        return self._publisher

    @property
    def topology(self) -> Topology:
        return self._topology

    async def publish(
        self, data: EventData, *, subject: str | None = None, correlation_id: str | None = None
    ) -> Envelope:
        return await self._publisher.publish(data, subject=subject, correlation_id=correlation_id)

    async def key_value(self, bucket: str) -> KeyValue:
        return await self._bus.key_value(bucket)

    def history(
        self,
        stream: str,
        *,
        filter_subjects: tuple[str, ...] = (),
        accepts: tuple[type[EventData], ...] = (),
    ) -> AsyncIterator[HistoricalEvent]:
        return read_history(self._bus, stream, filter_subjects=filter_subjects, accepts=accepts)

    async def prepare(self) -> None:
        """Create the topology; call before reading history or buckets ahead of `start`."""
        await self._bus.ensure_topology(self._topology)

    async def start(self) -> None:
        if self._tasks:
            raise RuntimeError(f"service {self._service.name} already started")
        await self.prepare()
        for hook in self._service.startup_hooks:
            await hook(self)
        for route in self._service.routes:
            for worker in range(route.workers):
                runner = HandlerRunner(
                    route, self._bus, self._publisher, tracer=self._tracer, settings=self._settings
                )
                self._tasks.append(
                    asyncio.create_task(runner.run(self._stopping), name=f"{route.name}[{worker}]")
                )
        for timer in self._service.timers:
            self._tasks.append(asyncio.create_task(self._run_timer(timer), name=timer.name))
        self._log.info("service started", handlers=len(self._service.routes))

    async def _run_timer(self, timer: Timer) -> None:
        # Ticks are scheduled on a fixed grid so a slow callback does not shift later ones.
        first_s = timer.interval_s if timer.first_in is None else max(timer.first_in(), 0.0)
        next_at = time.monotonic() + first_s
        while not self._stopping.is_set():
            try:
                await asyncio.wait_for(self._stopping.wait(), max(next_at - time.monotonic(), 0))
                return
            except TimeoutError:
                pass
            next_at += timer.interval_s
            if next_at < time.monotonic():  # fell behind by more than a tick: skip, don't burst
                next_at = time.monotonic() + timer.interval_s
            try:
                for emit in await timer.callback():
                    await self._publisher.publish(
                        emit.data,
                        subject=emit.subject,
                        correlation_id=emit.correlation_id,
                        event_id=emit.event_id,
                        trace_parent=emit.trace_parent,
                        links=emit.links,
                        traced=emit.traced,
                    )
            except Exception as exc:
                self._log.error("timer failed", timer=timer.name, error=repr(exc))

    def request_stop(self) -> None:
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def wait(self) -> None:
        """Until every runner ends; the first failure stops the others and is raised."""
        if not self._tasks:
            return
        done, pending = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = next((t for t in done if not t.cancelled() and t.exception() is not None), None)
        if failed is not None:
            self._log.error("runner failed, stopping", runner=failed.get_name())
            self.request_stop()
            await asyncio.wait(pending)
            raise failed.exception()  # type: ignore[misc]

    async def stop(self) -> None:
        self.request_stop()
        await self.wait()
        self._log.info("service stopped")

    async def abort(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def run(self, *, handle_signals: bool = True) -> None:
        """Start, then run until a signal (or `request_stop`) and stop gracefully."""
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            await self.start()
            await self.wait()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        self._log.info("stop requested", signal=sig.name)
        self.request_stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is None:
            await self.stop()
        else:
            await self.abort()
