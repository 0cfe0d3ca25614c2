"""The embedded cluster's nats-servers: one, or three joined by routes into a JetStream cluster."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import structlog

from gfair.bus.server import EmbeddedNatsServer, NatsServerConfig, NatsServerError

_log = structlog.get_logger("gfair.embedded_cluster")

# A JetStream cluster needs a quorum of its brokers; three survive the loss of one.
BROKER_CLUSTER_NAME = "gfair"


class Brokers:
    """The nats-servers a cluster started, under ``<data-dir>/nats`` (``n<i>`` each of several)."""

    def __init__(
        self,
        data_dir: Path,
        logs_dir: Path,
        *,
        max_payload: int | None = None,
    ) -> None:
        self._data_dir = data_dir
        self._logs_dir = logs_dir
        self._max_payload = max_payload
        self._config_file: Path | None = None
        self._env: dict[str, str] = {}
        self._servers: list[EmbeddedNatsServer] = []

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(server.url for server in self._servers)

    async def start(
        self,
        count: int,
        preferred_port: int | None = None,
        *,
        config_file: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Start `count` brokers; their client URLs, comma-separated. One broker takes
        `preferred_port` when it is free. `config_file` (the authorization) may name ``$VAR``s
        that `env` holds."""
        self._config_file = config_file
        self._env = dict(env or {})
        self._logs_dir.mkdir(parents=True, exist_ok=True)
        if count == 1:
            return await self._start_single(preferred_port)
        routes = tuple(f"nats://127.0.0.1:{_free_port()}" for _ in range(count))
        self._servers = [
            EmbeddedNatsServer(
                replace(
                    self._config(self._data_dir / "nats" / f"n{index}", f"nats-server-{index}.log"),
                    server_name=f"gfair-n{index}",
                    cluster_name=BROKER_CLUSTER_NAME,
                    cluster_listen=routes[index],
                    routes=routes,
                )
            )
            for index in range(count)
        ]
        urls = [await asyncio.to_thread(server.start) for server in self._servers]
        return ",".join(urls)

    async def _start_single(self, preferred_port: int | None) -> str:
        ports: list[int | None] = [None]
        if preferred_port is not None and _port_free(preferred_port):
            ports.insert(0, preferred_port)
        for port in ports:
            config = self._config(self._data_dir / "nats", "nats-server.log")
            server = EmbeddedNatsServer(replace(config, port=port))
            self._servers = [server]
            try:
                return await asyncio.to_thread(server.start)
            except NatsServerError:
                # Someone took the preferred port since it was probed; any free one will do.
                if port is None:
                    raise
                _log.info("preferred port taken; using a free one", port=port)
        raise AssertionError("unreachable: the last attempt raises")

    def _config(self, store_dir: Path, log_name: str) -> NatsServerConfig:
        return NatsServerConfig(
            store_dir=store_dir,
            log_file=self._logs_dir / log_name,
            config_file=self._config_file,
            env=self._env,
            max_payload=self._max_payload,
        )

    async def kill(self, index: int) -> None:
        """SIGKILL one broker, as a crash would."""
        await asyncio.to_thread(self._servers[index].kill)
        _log.warning("broker killed", broker=index)

    async def restart(self, index: int) -> None:
        """Start a stopped broker again on its ports, with its store (it catches up)."""
        await asyncio.to_thread(self._servers[index].start)
        _log.info("broker restarted", broker=index)

    async def stop(self) -> None:
        for server in self._servers:
            await asyncio.to_thread(server.stop)
        self._servers = []


def _free_port() -> int:
    """A port free right now, for a broker's cluster routes (which must be known up front)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nats-server could listen on `port` now (it sets SO_REUSEADDR, so does this)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True
