"""Many node executors in one process, their jobs virtual (`GFAIR_VIRTUAL_NODES`, `gfair up
--virtual`), for scale and load tests.

Every server of the cluster spec gets a `NodeExecutor` of its own, the very one a real server
runs: its node id (as `gfair up` names servers: ``v100-0``, ...), simulated GPUs, work root
``<work base>/<id>``, registration, heartbeats, telemetry and the durable consumer of its
commands, handled by the same `JobCommands`. Only where jobs run differs: a `VirtualHost`
instead of OS processes (`gfair.node.virtual_jobs`). The executors share one NATS connection
and one `VirtualHost`, whose checkpoints play the shared checkpoint root: a job suspended on
one resumes from its step on another. On SIGTERM every node drains its jobs, reported
suspended, as a real executor does.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal

import structlog

from gfair.bus.nats_bus import NatsBus
from gfair.bus.observability import configure_observability
from gfair.bus.runner import RunnerSettings
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.serve import BusSettings
from gfair.core.cluster import Server, parse_cluster_spec
from gfair.node.virtual_jobs import VirtualHost
from gfair_services.node_executor.executor import (
    COMMANDS_IN_FLIGHT,
    SERVICE_NAME,
    NodeExecutor,
)
from gfair_services.node_executor.settings import NodeExecutorSettings

_log = structlog.get_logger("gfair.services.node_executor")


def node_settings(settings: NodeExecutorSettings, server: Server) -> NodeExecutorSettings:
    """One virtual node's settings: the process's, for this server."""
    return settings.model_copy(
        update={
            "node_id": server.id,
            "simulate_gpus": f"{server.generation}:{server.gpus}",
            "work_root": settings.work_base / server.id,
            "virtual_nodes": "",
            # No process runs that a cgroup or a limit could hold.
            "job_cgroups": "off",
            "job_memory_per_gpu": "",
            "job_cpus_per_gpu": None,
            "job_pids_max": 0,
        }
    )


def virtual_executors(
    settings: NodeExecutorSettings, host: VirtualHost | None = None
) -> list[NodeExecutor]:
    """An executor for every server of `settings.virtual_nodes`, their jobs on `host`."""
    host = host or VirtualHost()
    servers = parse_cluster_spec(settings.virtual_nodes).servers
    return [NodeExecutor(node_settings(settings, server), host=host) for server in servers]


async def serve_virtual(
    settings: NodeExecutorSettings, bus_settings: BusSettings | None = None
) -> None:
    """Run the virtual nodes against NATS until SIGTERM/SIGINT, then drain their jobs."""
    bus_settings = bus_settings or BusSettings()
    observability = configure_observability(SERVICE_NAME)  # before the executors log
    executors = virtual_executors(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        bus = await NatsBus.connect(bus_settings.nats_options(name=f"{SERVICE_NAME}-virtual"))
        started: list[ServiceRuntime] = []
        try:
            runner = RunnerSettings(
                batch=COMMANDS_IN_FLIGHT, fetch_timeout_s=bus_settings.fetch_timeout_s
            )
            for executor in executors:
                runtime = ServiceRuntime(
                    executor.service, bus, tracer=observability.tracer, settings=runner
                )
                await runtime.start()
                started.append(runtime)
                if stop.is_set():
                    break
            _log.info("virtual nodes up", nodes=len(started))
            waits = [asyncio.create_task(runtime.wait()) for runtime in started]
            stopped = asyncio.create_task(stop.wait())
            # Until a signal, or until one node's runtime fails (it is then raised below).
            await asyncio.wait([stopped, *waits], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for runtime in started:
                runtime.request_stop()
            for result in await asyncio.gather(
                *(runtime.wait() for runtime in started), return_exceptions=True
            ):
                if isinstance(result, BaseException):
                    _log.error("a virtual node failed", error=repr(result))
            # Before the connection closes: the drains publish what they suspended.
            await asyncio.gather(*(executor.close() for executor in executors))
            await bus.close()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        with contextlib.suppress(Exception):
            await asyncio.gather(*(executor.close() for executor in executors))
        observability.shutdown()


__all__ = ["node_settings", "serve_virtual", "virtual_executors"]
