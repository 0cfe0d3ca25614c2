"""A whole gfair cluster on one machine: nats-server, the services, one node executor per server.

    async with EmbeddedCluster(ClusterOptions(cluster="v100:2x4,k80:2x4", quantum_s=3)) as c:
        ...  # c.nats_url, c.node_ids, c.log_path("placement")

`gfair up`, `gfair demo` and the end-to-end tests use it. Every service and executor is a child
process (``python -m gfair_services.<name>``) configured by ``GFAIR_*`` environment variables,
logging to ``<data-dir>/logs/<name>.log`` and tracing to one JSON Lines span file. Node
executors simulate the GPUs of the cluster spec (server ids as in `parse_cluster_spec`:
``v100-0``, ``v100-1``, ...) and share ``<data-dir>/checkpoints``.

Start-up: nats-server (unless an URL is given; its store is ``<data-dir>/nats``), the topology
once, then the children; the cluster is ready when every executor has registered since this
start and every service is pulling from its consumers. A child that dies is restarted with
growing back-off (services rebuild their state from the bus, DESIGN 3.3). Stop: SIGTERM to every
child, SIGKILL to those still alive after a grace period, then nats-server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import structlog

from gfair.bus.history import read_history
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.server import EmbeddedNatsServer, NatsServerConfig
from gfair.core.cluster import Cluster, parse_cluster_spec
from gfair.events.nodes import NodeRegistered
from gfair.events.subjects import NODES_STREAM, STREAMS
from gfair_services.topology import cluster_topology

_log = structlog.get_logger("gfair.embedded_cluster")

# Scheduler services, in start order (node executors come after them, one per server).
SCHEDULER_SERVICES: tuple[str, ...] = (
    "failure_detector",
    "profiler",
    "trading_auction",
    "placement",
    "split_stride",
)
NODE_EXECUTOR = "node_executor"


class ClusterError(RuntimeError):
    """The cluster would not start, or a part of it died while starting."""


@dataclass(frozen=True)
class ClusterOptions:
    cluster: str = "v100:2x4,k80:2x4"
    quantum_s: float = 3.0
    data_dir: Path = Path(".gfair")
    # An existing NATS (JetStream) server; None starts an embedded one.
    nats_url: str | None = None
    span_file: Path | None = None  # default <data-dir>/traces/spans.jsonl
    user_tickets: Mapping[str, float] = field(default_factory=dict)
    services: tuple[str, ...] = SCHEDULER_SERVICES
    heartbeat_s: float = 1.0
    log_level: str = "INFO"
    # More GFAIR_* settings for every child, e.g. {"GFAIR_FAIL_AFTER_S": "10"}.
    env: Mapping[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 60.0
    stop_grace_s: float = 15.0
    restart_children: bool = True

    def servers(self) -> Cluster:
        return parse_cluster_spec(self.cluster)


class Child:
    """One child process: how to start it, and its current incarnation."""

    def __init__(self, name: str, module: str, env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.module = module
        self.env = dict(env)
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.crashes: list[int] = []  # exit codes of unexpected exits
        self.kills = 0  # exits asked for by `EmbeddedCluster.kill`, not yet seen
        self._log: IO[bytes] | None = None

    @property
    def argv(self) -> list[str]:
        return [sys.executable, "-m", f"gfair_services.{self.module}"]

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self._log is None:
            self._log = self.log_path.open("ab")
        # A session of its own: a Ctrl-C on the terminal reaches `gfair up`, which then stops
        # the children in order, instead of every child at once.
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.starts += 1

    def signal(self, sig: signal.Signals) -> None:
        if self.alive:
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


class EmbeddedCluster:
    def __init__(self, options: ClusterOptions | None = None) -> None:
        self.options = options or ClusterOptions()
        self.data_dir = self.options.data_dir.expanduser().absolute()
        self.servers = self.options.servers()
        self.span_file = (
            self.options.span_file or self.data_dir / "traces" / "spans.jsonl"
        ).absolute()
        self._nats: EmbeddedNatsServer | None = None
        self._nats_url = self.options.nats_url
        self.children: dict[str, Child] = {}
        self._watchdog: asyncio.Task[None] | None = None
        self._stopping = False
        self.started_at: datetime | None = None

    # -- where things are ---------------------------------------------------------------------

    @property
    def nats_url(self) -> str:
        if self._nats_url is None:
            raise ClusterError("the cluster has not started")
        return self._nats_url

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(s.id for s in self.servers.servers)

    @property
    def checkpoint_root(self) -> Path:
        return self.data_dir / "checkpoints"

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    def log_path(self, name: str) -> Path:
        return self.children[name].log_path

    def child_env(self) -> dict[str, str]:
        """The environment every child starts with."""
        env = dict(os.environ)
        env.update(
            {
                "GFAIR_NATS_URL": self.nats_url,
                "GFAIR_SPAN_FILE": str(self.span_file),
                "GFAIR_LOG_LEVEL": self.options.log_level,
                "GFAIR_LOG_FORMAT": "json",
                "GFAIR_QUANTUM_S": f"{self.options.quantum_s:g}",
                "GFAIR_CHECKPOINT_ROOT": str(self.checkpoint_root),
                "GFAIR_HEARTBEAT_S": f"{self.options.heartbeat_s:g}",
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.options.user_tickets:
            env["GFAIR_USER_TICKETS"] = ",".join(
                f"{user}={tickets:g}" for user, tickets in self.options.user_tickets.items()
            )
        env.update(self.options.env)
        return env

    # -- start ----------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        self.started_at = datetime.now(UTC)
        for folder in (self.logs_dir, self.span_file.parent, self.checkpoint_root):
            folder.mkdir(parents=True, exist_ok=True)
        try:
            if self._nats_url is None:
                self._nats = EmbeddedNatsServer(
                    NatsServerConfig(
                        store_dir=self.data_dir / "nats",
                        log_file=self.logs_dir / "nats-server.log",
                    )
                )
                self._nats_url = await asyncio.to_thread(self._nats.start)
            bus = await NatsBus.connect(NatsOptions(servers=(self.nats_url,), name="gfair-up"))
            try:
                await bus.ensure_topology(cluster_topology())
                self._spawn_all()
                self._watchdog = asyncio.create_task(self._watch(), name="gfair-up-watchdog")
                await self._wait_ready(bus)
            finally:
                await bus.close()
        except BaseException:
            await self.stop()
            raise
        _log.info("cluster ready", nats=self.nats_url, nodes=len(self.node_ids))

    def _spawn_all(self) -> None:
        base = self.child_env()
        for name in self.options.services:
            child = Child(name, name, base, self.logs_dir / f"{name.replace('_', '-')}.log")
            self.children[name] = child
        for server in self.servers.servers:
            env = dict(base)
            env.update(
                {
                    "GFAIR_NODE_ID": server.id,
                    "GFAIR_SIMULATE_GPUS": f"{server.generation}:{server.gpus}",
                    "GFAIR_WORK_ROOT": str(self.data_dir / "nodes" / server.id),
                }
            )
            self.children[server.id] = Child(
                server.id, NODE_EXECUTOR, env, self.logs_dir / f"node-{server.id}.log"
            )
        for child in self.children.values():
            child.start()

    async def _wait_ready(self, bus: NatsBus) -> None:
        deadline = time.monotonic() + self.options.ready_timeout_s
        waiting_nodes = set(self.node_ids)
        waiting_services = {name.replace("_", "-") for name in self.options.services}
        while waiting_nodes or waiting_services:
            for child in self.children.values():
                if child.crashes or not child.alive:
                    raise ClusterError(
                        f"{child.name} exited while starting; its log "
                        f"({child.log_path}) ends:\n{child.log_tail()}"
                    )
            if waiting_nodes:
                waiting_nodes -= await self._registered_since(bus)
            if waiting_services:
                waiting_services -= await self._consuming(bus, waiting_services)
            if time.monotonic() > deadline:
                missing = ", ".join(sorted(waiting_nodes | waiting_services))
                raise ClusterError(
                    f"cluster not ready within {self.options.ready_timeout_s:g}s; still "
                    f"waiting for {missing} (logs in {self.logs_dir})"
                )
            if waiting_nodes or waiting_services:
                await asyncio.sleep(0.1)

    async def _registered_since(self, bus: NatsBus) -> set[str]:
        assert self.started_at is not None
        found: set[str] = set()
        async for past in read_history(
            bus,
            NODES_STREAM.name,
            filter_subjects=(NodeRegistered.subject_pattern(),),
            accepts=(NodeRegistered,),
        ):
            if past.envelope.time >= self.started_at and isinstance(past.data, NodeRegistered):
                found.add(past.data.node_id)
        return found

    async def _consuming(self, bus: NatsBus, services: set[str]) -> set[str]:
        """Services with a consumer that a live process is pulling from right now."""
        js = bus.client.jetstream()
        pulling: set[str] = set()
        for stream in STREAMS:
            try:
                consumers = await js.consumers_info(stream.name)
            except Exception:  # the stream may not have consumers yet
                continue
            for info in consumers:
                name = info.name or ""
                if (info.num_waiting or 0) > 0 or (info.num_ack_pending or 0) > 0:
                    pulling.update(s for s in services if name.startswith(f"{s}-"))
        return pulling

    # -- keep children alive --------------------------------------------------------------------

    async def _watch(self) -> None:
        backoff: dict[str, float] = {}
        while not self._stopping:
            await asyncio.sleep(0.5)
            for child in self.children.values():
                if self._stopping or child.alive or child.process is None:
                    continue
                code = child.process.returncode
                if child.kills:
                    child.kills -= 1
                else:
                    child.crashes.append(code)
                    _log.warning(
                        "child exited", child=child.name, code=code, log=str(child.log_path)
                    )
                if not self.options.restart_children:
                    continue
                delay = backoff.get(child.name, 0.5)
                backoff[child.name] = min(delay * 2, 30.0)
                await asyncio.sleep(delay)
                if not self._stopping:
                    child.start()
                    _log.info("child restarted", child=child.name, pid=child.pid)

    def kill(self, name: str) -> None:
        """SIGKILL one child, as a crash would; the watchdog restarts it (not a crash)."""
        child = self.children[name]
        if child.alive:
            child.kills += 1
            child.signal(signal.SIGKILL)

    # -- stop -----------------------------------------------------------------------------------

    async def stop(self) -> None:
        self._stopping = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None
        await self._stop_children(list(self.children.values()))
        if self._nats is not None:
            await asyncio.to_thread(self._nats.stop)
            self._nats = None

    async def _stop_children(self, children: Sequence[Child]) -> None:
        for child in children:
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.options.stop_grace_s
        while time.monotonic() < deadline:
            if not any(c.alive for c in children):
                break
            await asyncio.sleep(0.05)
        for child in children:
            if child.alive:
                _log.warning("child ignored SIGTERM; killing it", child=child.name)
                child.signal(signal.SIGKILL)
        for child in children:
            if child.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(child.process.wait, 5.0)
            child.close_log()
