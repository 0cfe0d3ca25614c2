"""The entry point of a service process: `python -m gfair_services.<name>` calls `main`."""

from __future__ import annotations

import asyncio

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.observability import ObservabilitySettings, configure_observability
from gfair.bus.runner import RunnerSettings
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.service import Service


class BusSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

    nats_url: str = Field(
        default="nats://127.0.0.1:4222", description="Comma-separated NATS server URLs"
    )
    fetch_batch: int = Field(default=10, ge=1)
    fetch_timeout_s: float = Field(default=1.0, gt=0)

    @property
    def servers(self) -> tuple[str, ...]:
        return tuple(url.strip() for url in self.nats_url.split(",") if url.strip())


async def serve(
    service: Service,
    bus_settings: BusSettings | None = None,
    observability_settings: ObservabilitySettings | None = None,
) -> None:
    """Run `service` against NATS until SIGTERM/SIGINT, then drain and flush telemetry."""
    bus_settings = bus_settings or BusSettings()
    observability = configure_observability(service.name, observability_settings)
    try:
        bus = await NatsBus.connect(NatsOptions(servers=bus_settings.servers, name=service.name))
        try:
            runtime = ServiceRuntime(
                service,
                bus,
                tracer=observability.tracer,
                settings=RunnerSettings(
                    batch=bus_settings.fetch_batch, fetch_timeout_s=bus_settings.fetch_timeout_s
                ),
            )
            await runtime.run(handle_signals=True)
        finally:
            await bus.close()
    finally:
        observability.shutdown()


def main(service: Service) -> None:
    asyncio.run(serve(service))
