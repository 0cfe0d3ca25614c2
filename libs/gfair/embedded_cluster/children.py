"""The embedded cluster's child processes (services and node executors), kept alive.

A child that dies is restarted with growing back-off, unless it was killed on purpose and held
down (`Children.kill(..., restart=False)` until `revive`); stopping sends SIGTERM to all, then
SIGKILL to those still alive after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import structlog

_log = structlog.get_logger("gfair.embedded_cluster")

# The longest wait before a crashed child is started again.
_MAX_BACKOFF_S = 30.0


class Child:
    """One child process: how to start it, and its current incarnation."""

    def __init__(self, name: str, module: str, env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.module = module
        self.env = dict(env)
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.started_at: datetime | None = None  # when the current process was started
        self.crashes: list[int] = []  # exit codes of unexpected exits
        self.kills = 0  # exits asked for by `Children.kill`, not yet seen
        # Killed on purpose and left down until `Children.revive`.
        self.held = False
        self.exit_seen = False  # the watchdog has accounted for this incarnation's exit
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
            # Logs name every tenant's jobs: readable by the cluster's user alone.
            fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._log = os.fdopen(fd, "ab")
        # A session of its own: a Ctrl-C on the terminal reaches `gfair up`, which then stops
        # the children in order, instead of every child at once.
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            # What the children write (spans, records) is their user's alone; what jobs must
            # reach, the executors open to them explicitly.
            umask=0o077,
        )
        self.starts += 1
        self.started_at = datetime.now(UTC)
        self.exit_seen = False

    @property
    def restarts(self) -> int:
        return max(self.starts - 1, 0)

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


class Children(dict[str, Child]):
    """The cluster's children by name, and the watchdog that restarts those that die."""

    def __init__(self, *, restart: bool) -> None:
        super().__init__()
        self._restart = restart
        self._stopping = False
        self._watchdog: asyncio.Task[None] | None = None

    def start_all(self) -> None:
        for child in self.values():
            child.start()
        self._watchdog = asyncio.create_task(self._watch(), name="gfair-up-watchdog")

    async def _watch(self) -> None:
        backoff: dict[str, float] = {}
        while not self._stopping:
            await asyncio.sleep(0.5)
            for child in self.values():
                if self._stopping or child.alive or child.process is None or child.exit_seen:
                    continue
                child.exit_seen = True
                code = child.process.returncode
                if child.kills:
                    child.kills -= 1
                else:
                    child.crashes.append(code)
                    _log.warning(
                        "child exited", child=child.name, code=code, log=str(child.log_path)
                    )
                if child.held or not self._restart:
                    continue
                delay = backoff.get(child.name, 0.5)
                backoff[child.name] = min(delay * 2, _MAX_BACKOFF_S)
                await asyncio.sleep(delay)
                if not self._stopping:
                    child.start()
                    _log.info("child restarted", child=child.name, pid=child.pid)

    def kill(self, name: str, *, restart: bool = True) -> None:
        """SIGKILL one child, as a crash would; the watchdog restarts it (not a crash).

        With `restart=False` it stays down (a node that is gone) until `revive(name)`.
        """
        child = self[name]
        if child.alive:
            child.kills += 1
            child.held = not restart
            child.signal(signal.SIGKILL)

    def revive(self, name: str) -> None:
        """Start again a child killed with `restart=False` (a lost node coming back)."""
        child = self[name]
        child.held = False
        if not child.alive and not self._stopping:
            child.start()
            _log.info("child revived", child=child.name, pid=child.pid)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM to every child, SIGKILL to those still alive after `grace_s`."""
        self._stopping = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None
        children = list(self.values())
        for child in children:
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
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
