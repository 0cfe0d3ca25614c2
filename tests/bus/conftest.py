"""The same tests run on the in-memory bus and on a real nats-server (`broker` fixture)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.runner import RunnerSettings
from gfair.bus.server import EmbeddedNatsServer
from gfair.bus.transport import Bus

FAST = RunnerSettings(batch=10, fetch_timeout_s=0.05, error_pause_s=0.05)


@dataclass
class Broker:
    """One message broker; `connect()` is a new client, as a new process would open."""

    kind: str
    server: EmbeddedNatsServer | None = None
    memory: InMemoryBus | None = None
    clients: list[Bus] = field(default_factory=list)

    async def connect(self) -> Bus:
        if self.memory is not None:
            return self.memory
        assert self.server is not None
        bus = await NatsBus.connect(
            NatsOptions(
                servers=(self.server.url,),
                publish_deadline_s=10.0,
                reconnect_wait_s=0.1,
            )
        )
        self.clients.append(bus)
        return bus

    async def crash(self, bus: Bus) -> None:
        """Drop a client as a killed process would: no drain, nothing flushed or acked."""
        if isinstance(bus, NatsBus):
            await bus.client.close()

    async def close(self) -> None:
        for client in self.clients:
            await client.close()
        if self.memory is not None:
            await self.memory.close()


@pytest.fixture(params=["memory", pytest.param("nats", marks=pytest.mark.nats)])
async def broker(request: pytest.FixtureRequest) -> AsyncIterator[Broker]:
    if request.param == "memory":
        found = Broker("memory", memory=InMemoryBus())
    else:
        found = Broker("nats", server=request.getfixturevalue("nats_server"))
    try:
        yield found
    finally:
        await found.close()


@pytest.fixture
async def bus(broker: Broker) -> Bus:
    return await broker.connect()


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer_provider(spans: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return provider
