"""Live clusters for the reliability tests: embedded brokers, the services, simulated nodes.

Failure handling is tuned for seconds rather than minutes (suspect a silent node after 3 s, fail
it after 6 s, retry after 0.2 s), so that a test can watch a whole failure and recovery.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gfair.bus.transport import BusError
from gfair.client import GfairClient
from gfair.client.connection import ConnectOptions
from gfair.client.errors import ClientError, WaitTimeout
from gfair.embedded_cluster import ClusterOptions, EmbeddedCluster
from gfair.events.jobs import JobEvent
from gfair.events.states import JobState
from support.waiting import eventually

StartCluster = Callable[..., AbstractAsyncContextManager[EmbeddedCluster]]
T = TypeVar("T")

FAST_RECOVERY: Mapping[str, str] = {
    "GFAIR_SUSPECT_AFTER_S": "3",
    "GFAIR_FAIL_AFTER_S": "6",
    "GFAIR_RETRY_BASE_S": "0.2",
    "GFAIR_RETRY_CAP_S": "2",
    "GFAIR_ACK_WAIT_S": "3",
    "GFAIR_FENCE_GRACE_S": "5",
    "GFAIR_TERM_GRACE_S": "1",
}


@pytest.fixture
def start_cluster(tmp_path: Path) -> StartCluster:
    @asynccontextmanager
    async def start(
        cluster: str = "v100:2x2",
        quantum_s: float = 1.0,
        env: Mapping[str, str] | None = None,
        **options: Any,
    ) -> AsyncIterator[EmbeddedCluster]:
        settings = ClusterOptions(
            cluster=cluster,
            quantum_s=quantum_s,
            data_dir=tmp_path / "gfair",
            heartbeat_s=0.5,
            env={**FAST_RECOVERY, **(env or {})},
            **options,
        )
        async with EmbeddedCluster(settings) as running:
            yield running
            # Deaths the test caused are counted as kills; any other one is a bug.
            crashed = {n: c.crashes for n, c in running.children.items() if c.crashes}
            assert not crashed, f"processes died during the test: {crashed}"

    return start


@asynccontextmanager
async def client_of(cluster: EmbeddedCluster) -> AsyncIterator[GfairClient]:
    # Rides out a broker going away: it reconnects to another for as long as it takes.
    options = ConnectOptions(max_reconnect_attempts=-1, name="reliability-test")
    client = await GfairClient.connect(cluster.nats_url, options=options, poll_interval_s=0.05)
    async with client:
        yield client


async def patiently(call: Callable[[], Awaitable[T]], timeout_s: float = 60.0) -> T:
    """`call()`, tried again while the cluster cannot answer (a broker gone, leaders moving).

    A tool gives up after a few seconds, as a person at a terminal wants; a script that must
    see its jobs through retries, as this does. Past `timeout_s`, the last error is raised.
    """
    errors: list[Exception] = []

    async def answered() -> tuple[T] | None:
        try:
            return (await call(),)
        except WaitTimeout:
            raise
        except (ClientError, BusError) as exc:
            errors.append(exc)
            return None

    try:
        (value,) = await eventually(answered, timeout_s, 0.5, what="an answer from the cluster")
    except AssertionError:
        if not errors:
            raise
        raise errors[-1] from None
    return value


async def finished(client: GfairClient, user: str, job_id: str, timeout_s: float) -> JobState:
    """Wait until the job's events reach a terminal state; return it."""
    deadline = time.monotonic() + timeout_s

    async def watch() -> JobState | None:
        left = max(deadline - time.monotonic(), 0.1)
        async for event in client.watch(user, job_id, timeout_s=left):
            state = event.data.JOB_STATE if isinstance(event.data, JobEvent) else None
            if state is not None and state.terminal:
                return state
        return None

    state = await patiently(watch, timeout_s)
    if state is None:
        raise AssertionError(f"{user}/{job_id} did not finish within {timeout_s}s")
    return state
