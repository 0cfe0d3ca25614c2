"""Shared by the placement and split-stride service tests: events to feed, outputs to read."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.publisher import EventPublisher
from gfair.bus.runner import RunnerSettings
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.service import Service
from gfair.events.codec import decode
from gfair.events.envelope import Envelope, EventData
from gfair.events.nodes import GpuInfo, NodeRegistered
from gfair.events.submission import JobSubmitted
from support.waiting import eventually

FAST = RunnerSettings(batch=50, fetch_timeout_s=0.02, error_pause_s=0.02)
E = TypeVar("E", bound=EventData)


def registered(
    node_id: str, generation: str = "v100", gpus: int = 4, heartbeat_interval_s: float = 1.0
) -> NodeRegistered:
    return NodeRegistered(
        node_id=node_id,
        hostname=node_id,
        gpus=tuple(
            GpuInfo(
                index=i,
                uuid=f"GPU-{node_id}-{i}",
                name=f"Simulated {generation}",
                generation=generation,
                memory_bytes=16 << 30,
            )
            for i in range(gpus)
        ),
        heartbeat_interval_s=heartbeat_interval_s,
        simulated=True,
    )


def submitted(user: str, job_id: str, gpus: int = 1, **fields: object) -> JobSubmitted:
    values: dict[str, object] = {
        "user": user,
        "job_id": job_id,
        "gpus": gpus,
        "command": ("python", "-c", "pass"),
    }
    values.update(fields)
    return JobSubmitted.model_validate(values)


class Probe:
    """A tool on the bus: publishes events and reads back what services published."""

    def __init__(self, bus: InMemoryBus) -> None:
        self.bus = bus
        self.tool = EventPublisher(bus, "test-tool")

    async def publish(
        self, data: EventData, *, subject: str | None = None, correlation_id: str | None = None
    ) -> Envelope:
        return await self.tool.publish(data, subject=subject, correlation_id=correlation_id)

    def events(self, stream: str, kind: type[E]) -> list[tuple[Envelope, E]]:
        found: list[tuple[Envelope, E]] = []
        for message in self.bus.stream_messages(stream):
            decoded = decode(message.data)
            if isinstance(decoded.data, kind):
                found.append((decoded.envelope, decoded.data))
        return found

    def payloads(self, stream: str, kind: type[E]) -> list[E]:
        return [data for _, data in self.events(stream, kind)]

    async def wait_for(
        self,
        stream: str,
        kind: type[E],
        check: Callable[[list[E]], bool] = bool,
        timeout_s: float = 5.0,
    ) -> list[E]:
        """Poll until the `kind` events in `stream` satisfy `check`; return them."""
        found: list[E] = []

        def satisfied() -> bool:
            found[:] = self.payloads(stream, kind)
            return check(found)

        await eventually(satisfied, timeout_s, what=f"{kind.__name__} in {stream}")
        return found

    async def drained(self) -> None:
        """Wait until the consumers settled all that was published, and what that caused (for
        asserting that nothing more happened): a handler's outputs are stored before its input
        is acknowledged, so the backlog is empty only at the end of a chain."""
        await eventually(lambda: self.bus.backlog() == 0, what="consumers drained")


class ServiceHarness:
    """One service on an in-memory bus, and a tool publishing to it."""

    def __init__(
        self, bus: InMemoryBus, build: Callable[[], Service], runner: RunnerSettings = FAST
    ) -> None:
        self.bus = bus
        self.tool = EventPublisher(bus, "test-tool")
        self.runtime: ServiceRuntime | None = None
        self._build = build
        self._runner = runner

    async def start(self) -> None:
        self.runtime = ServiceRuntime(self._build(), self.bus, settings=self._runner)
        await self.runtime.start()

    async def stop(self) -> None:
        assert self.runtime is not None
        await self.runtime.stop()

    async def publish(self, *events: EventData) -> None:
        for event in events:
            await self.tool.publish(event)
