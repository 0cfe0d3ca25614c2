"""One job runner per user on this node (a `JobSupervisor`, or virtual: `JobHost`), each in a
task of its own.

A supervisor keeps a job's checkpoints in `<its checkpoint root>/<job_id>`; job ids are unique
per user only, so each user gets a supervisor rooted at `<checkpoint_root>/<user>`, which is
where the scheduler points a job's checkpoint directory. A supervisor is an async context
(an AnyIO task group): it is entered and left in a host task of its own, since commands that
first need it arrive on whichever task handles them. Each host also runs the relay of its
supervisor's reports, which ends when the supervisor closes its report stream.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from gfair.events.fields import TOKEN_REGEX
from gfair.node.job_host import JobHost
from gfair.node.job_runner import JobRunner, SupervisorConfig
from gfair.node.lifecycle import JobEvent
from gfair.node.orphans import ReapedRun

_log = structlog.get_logger("gfair.services.node_executor")
_TOKEN = re.compile(TOKEN_REGEX)

Relay = Callable[[str, JobEvent], Awaitable[None]]


@dataclass
class _Host:
    task: asyncio.Task[None] | None = None
    ready: asyncio.Future[JobRunner[Any]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    stop: asyncio.Event = field(default_factory=asyncio.Event)


class UserSupervisors:
    def __init__(
        self, config_for: Callable[[str], SupervisorConfig], relay: Relay, host: JobHost
    ) -> None:
        self._config_for = config_for
        self._job_host = host
        self._relay = relay
        self._hosts: dict[str, _Host] = {}
        self._closed = False

    async def get(self, user: str) -> JobRunner[Any]:
        """The user's supervisor, started (and its user's orphans reaped) on first use."""
        host = self._hosts.get(user)
        if host is None:
            if self._closed:
                raise RuntimeError("the node executor is shutting down")
            host = self._hosts[user] = _Host()
            # A context of its own: the host outlives the command whose trace it would inherit.
            host.task = asyncio.create_task(
                self._host(user, host), name=f"supervisor-{user}", context=contextvars.Context()
            )
        return await asyncio.shield(host.ready)

    async def open_existing(self, runs_root: Path) -> list[tuple[str, ReapedRun]]:
        """Start the supervisor of every user with runs here, which stops orphaned runs."""
        reaped: list[tuple[str, ReapedRun]] = []
        for user in _users_with_runs(runs_root):
            supervisor = await self.get(user)
            reaped.extend((user, run) for run in supervisor.reaped)
        return reaped

    async def close(self) -> None:
        """Close every supervisor (what still runs is suspended) and end the relays."""
        self._closed = True
        for host in self._hosts.values():
            host.stop.set()
        tasks = [host.task for host in self._hosts.values() if host.task is not None]
        for result in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(result, BaseException):
                _log.error("supervisor host failed", error=repr(result))

    async def _host(self, user: str, host: _Host) -> None:
        try:
            async with self._job_host.runner(self._config_for(user)) as supervisor:
                relay = asyncio.create_task(self._pump(user, supervisor), name=f"relay-{user}")
                host.ready.set_result(supervisor)
                await host.stop.wait()
            # Leaving the block closed the report stream: the relay ends after the last one.
            await relay
        except BaseException as exc:
            if not host.ready.done():
                host.ready.set_exception(exc)
                # Not kept: the next command for this user tries again.
                if self._hosts.get(user) is host:
                    del self._hosts[user]
            raise

    async def _pump(self, user: str, supervisor: JobRunner[Any]) -> None:
        async with supervisor.events:
            async for report in supervisor.events:
                try:
                    await self._relay(user, report)
                except Exception as exc:
                    # One report that cannot be published must not silence the others.
                    _log.error(
                        "relaying a job report failed",
                        user=user,
                        job_id=report.job_id,
                        report=type(report).__name__,
                        error=repr(exc),
                    )


def _users_with_runs(runs_root: Path) -> list[str]:
    # A listing of one local directory, once at start: not worth a thread.
    if not runs_root.is_dir():
        return []
    return sorted(d.name for d in runs_root.iterdir() if d.is_dir() and _TOKEN.match(d.name))
