"""Running a node executor: `build_service` for the convention, `serve` for a real process.

The executor owns resources beyond its handlers (job processes), so its process runs `serve`:
on SIGTERM the runtime stops taking commands, then every job is checkpointed and reported
suspended (reason drain) while the bus is still open, and only then does the connection close.
With `virtual_nodes` set, the process runs a virtual executor per server of that spec instead.
"""

from __future__ import annotations

from gfair.bus.nats_bus import NatsBus
from gfair.bus.observability import configure_observability
from gfair.bus.runner import RunnerSettings
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.serve import BusSettings
from gfair.bus.service import Service
from gfair_services.node_executor.executor import (
    COMMANDS_IN_FLIGHT,
    SERVICE_NAME,
    NodeExecutor,
)
from gfair_services.node_executor.output_shipper import OutputShipper
from gfair_services.node_executor.settings import NodeExecutorSettings
from gfair_services.node_executor.virtual_nodes import serve_virtual


def build_service(settings: NodeExecutorSettings | None = None) -> Service:
    """The executor's handlers and timers; without `serve`, its jobs are not drained on stop."""
    return NodeExecutor(settings).service


async def serve(
    settings: NodeExecutorSettings | None = None, bus_settings: BusSettings | None = None
) -> None:
    """Run one node executor against NATS until SIGTERM/SIGINT, then drain its jobs; with
    `virtual_nodes`, a virtual executor per server of that spec (`virtual_nodes`)."""
    bus_settings = bus_settings or BusSettings()
    settings = settings or NodeExecutorSettings()
    if settings.virtual_nodes:
        await serve_virtual(settings, bus_settings)
        return
    executor = NodeExecutor(settings)
    observability = configure_observability(SERVICE_NAME)
    try:
        # The same credentials and TLS as every other service (GFAIR_NATS_USER, ...).
        bus = await NatsBus.connect(
            bus_settings.nats_options(name=f"{SERVICE_NAME}-{executor.node_id}")
        )
        try:
            runtime = ServiceRuntime(
                executor.service,
                bus,
                tracer=observability.tracer,
                settings=RunnerSettings(
                    batch=COMMANDS_IN_FLIGHT, fetch_timeout_s=settings.command_wait_s
                ),
            )
            shipper = OutputShipper(
                bus,
                executor.node_id,
                executor.settings.work_dir / "runs",
                executor.settings.work_dir / "shipped-output",
                executor.runs,
                interval_s=executor.settings.output_interval_s,
                max_bytes=executor.settings.job_output_max_bytes,
                retention_s=executor.settings.run_retention_s,
            )
            try:
                shipper.start()  # its first pass comes after the runtime declared the stream
                await runtime.run(handle_signals=True)
            finally:
                # Before the connection closes: the drain publishes what it suspended, and
                # the jobs' last output follows.
                await executor.close()
                await shipper.stop()
        finally:
            await bus.close()
    finally:
        await executor.close()  # a no-op after the drain; releases the GPUs if NATS failed
        observability.shutdown()
