"""Many node executors in one process, their jobs virtual (`GFAIR_VIRTUAL_NODES`, `gfair up
--virtual`), for scale and load tests.

Every server of the cluster spec gets a `NodeExecutor` of its own, the very one a real server
runs: its node id (as `gfair up` names servers: ``v100-0``, ...), simulated GPUs, work root
``<work base>/<id>``, registration, heartbeats, telemetry and the durable consumer of its
commands, handled by the same `JobCommands`. Only where jobs run differs: a `VirtualHost`
instead of OS processes (`gfair.node.virtual_jobs`), whose checkpoints, small files on the
checkpoint root, play the shared checkpoint root: a job suspended on one node resumes from its
step on another. On SIGTERM every node drains its jobs, reported suspended, as a real executor
does.

A process runs at most `virtual_nodes_per_process` of them (`virtual_parts`), on one NATS
connection: a thousand executors on one connection and one event loop fell behind what the
broker sent them, their consumers' answers read so late that they were taken for gone and
declared again by the thousand, until the broker cut the connection off as a slow consumer.
A spec of more servers runs in parts, each a process of its own: `gfair up` starts and
restarts each part as a child of its own (`virtual_part`); a process given the whole spec and
no part starts its parts itself and starts again any that exits (`run_parts`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

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


def virtual_parts(spec: str, per_process: int) -> list[tuple[Server, ...]]:
    """The servers of `spec`, in its order, in parts of `per_process` (the last one may be
    smaller): part k is the k-th process's."""
    servers = parse_cluster_spec(spec).servers
    return [tuple(servers[i : i + per_process]) for i in range(0, len(servers), per_process)]


def part_servers(settings: NodeExecutorSettings) -> tuple[Server, ...]:
    """The servers this process runs: its part (`virtual_part`), or, with none, every one."""
    if settings.virtual_part is None:
        return tuple(parse_cluster_spec(settings.virtual_nodes).servers)
    return virtual_parts(settings.virtual_nodes, settings.virtual_nodes_per_process)[
        settings.virtual_part
    ]


def virtual_executors(
    settings: NodeExecutorSettings, host: VirtualHost | None = None
) -> list[NodeExecutor]:
    """An executor for every server of this process's part of `settings.virtual_nodes`
    (`part_servers`), their jobs on `host`."""
    host = host or VirtualHost()
    return [
        NodeExecutor(node_settings(settings, server), host=host)
        for server in part_servers(settings)
    ]


async def serve_virtual(
    settings: NodeExecutorSettings, bus_settings: BusSettings | None = None
) -> None:
    """Run the virtual nodes against NATS until SIGTERM/SIGINT, then drain their jobs; a
    spec of more servers than one process runs, without a part given, in parts (`run_parts`)."""
    parts = virtual_parts(settings.virtual_nodes, settings.virtual_nodes_per_process)
    if settings.virtual_part is None and len(parts) > 1:
        await run_parts(settings, len(parts))
        return
    bus_settings = bus_settings or BusSettings()
    observability = configure_observability(SERVICE_NAME)  # before the executors log
    executors = virtual_executors(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        part = "" if settings.virtual_part is None else f"-{settings.virtual_part}"
        bus = await NatsBus.connect(bus_settings.nats_options(name=f"{SERVICE_NAME}-virtual{part}"))
        started: list[ServiceRuntime] = []
        try:
            runner = RunnerSettings(
                batch=COMMANDS_IN_FLIGHT, fetch_timeout_s=settings.command_wait_s
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


# Settings every virtual node gets its own of (`node_settings`): not handed to the parts.
_PER_NODE = frozenset({"node_id", "simulate_gpus", "work_root", "virtual_part"})
# How long a part has to drain its nodes' jobs after SIGTERM before it is killed.
_PART_STOP_GRACE_S = 60.0


def part_environment(settings: NodeExecutorSettings, part: int) -> dict[str, str]:
    """The environment part `part` starts with: this process's, and every setting given to
    this process (a flag of `gfair service` too) as its ``GFAIR_*`` variable."""
    env = dict(os.environ)
    for name in settings.model_fields_set - _PER_NODE:
        value = getattr(settings, name)
        if value is not None:
            env[f"GFAIR_{name.upper()}"] = str(value)
    env["GFAIR_VIRTUAL_NODES"] = settings.virtual_nodes
    env["GFAIR_VIRTUAL_NODES_PER_PROCESS"] = str(settings.virtual_nodes_per_process)
    env["GFAIR_VIRTUAL_PART"] = str(part)
    return env


async def run_parts(
    settings: NodeExecutorSettings, count: int, stop: asyncio.Event | None = None
) -> None:
    """Every part of the spec in a process of its own (``python -m
    gfair_services.node_executor`` with `virtual_part` set), each started again with growing
    back-off when it exits, until SIGTERM/SIGINT (or `stop`); then each is stopped (SIGTERM:
    its nodes drain their jobs), killed past a grace."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        _log.info(
            "virtual nodes in parts", parts=count, per_process=settings.virtual_nodes_per_process
        )
        await asyncio.gather(*(_keep_part(settings, part, stop) for part in range(count)))
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _keep_part(settings: NodeExecutorSettings, part: int, stop: asyncio.Event) -> None:
    backoff_s = 0.5
    while not stop.is_set():
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gfair_services.node_executor",
            env=part_environment(settings, part),
            stdin=asyncio.subprocess.DEVNULL,
        )
        exited = asyncio.create_task(process.wait())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait((exited, stopping), return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            stopping.cancel()
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                await asyncio.wait_for(exited, _PART_STOP_GRACE_S)
            except TimeoutError:
                _log.warning("a part ignored SIGTERM; killing it", part=part)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await exited
            return
        stopping.cancel()
        _log.warning("a part of the virtual nodes exited", part=part, code=process.returncode)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), backoff_s)
        backoff_s = min(backoff_s * 2, 30.0)


__all__ = [
    "node_settings",
    "part_environment",
    "part_servers",
    "run_parts",
    "serve_virtual",
    "virtual_executors",
    "virtual_parts",
]
