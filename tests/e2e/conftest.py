"""A real gfair cluster per test: embedded nats-server, the services and simulated nodes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gfair.bus.publisher import EventPublisher
from gfair.client import GfairClient
from gfair.embedded_cluster import ClusterOptions, EmbeddedCluster
from gfair.events.jobs import JobResumed, JobStarted
from gfair.events.nodes import NodeQuarantined
from node.helpers import JOB_PYTHON, reachable_tmp, sdk_on_pythonpath
from support.waiting import eventually

StartCluster = Callable[..., AbstractAsyncContextManager[EmbeddedCluster]]

RESNET = "ResNet-50 (batch size 32)"  # 7.8 steps/s on one V100
# The operator's word that moving a job costs next to nothing here (a checkpoint on the local
# disk, a process start): with the default 3 s a move would not pay within the sub-second quanta
# of the tests that move jobs between servers, and the kernel would rightly keep them in place.
FREE_MOVES = {"GFAIR_MIGRATION_COST_S": "0"}


def synthetic(
    *, duration_s: float | None = None, iterations: int | None = None, speed_scale: float = 10.0
) -> list[str]:
    """The synthetic training job: `duration_s` of V100 training, `speed_scale` times faster."""
    length = ["--iterations", str(iterations)] if iterations else ["--duration-s", str(duration_s)]
    return [
        JOB_PYTHON,
        "-m",
        "gfair.sdk.synthetic",
        "--job-type",
        RESNET,
        *length,
        "--speed-scale",
        f"{speed_scale:g}",
    ]


# As root, jobs run as their tenants' own uids: directories, a Python and the SDK those reach.
tmp_path = pytest.fixture(name="tmp_path")(reachable_tmp)
sdk_for_jobs = pytest.fixture(autouse=True)(sdk_on_pythonpath)


@pytest.fixture
def start_cluster(tmp_path: Path) -> StartCluster:
    @asynccontextmanager
    async def start(
        cluster: str = "v100:2x2", quantum_s: float = 1.0, **options: Any
    ) -> AsyncIterator[EmbeddedCluster]:
        settings = ClusterOptions(
            cluster=cluster, quantum_s=quantum_s, data_dir=tmp_path / "gfair", **options
        )
        async with EmbeddedCluster(settings) as running:
            yield running
            crashed = {n: c.crashes for n, c in running.children.items() if c.crashes}
            assert not crashed, f"processes died during the test: {crashed}"

    return start


@asynccontextmanager
async def client_of(cluster: EmbeddedCluster) -> AsyncIterator[GfairClient]:
    client = await GfairClient.connect(cluster.nats_url, poll_interval_s=0.05)
    async with client:
        yield client


async def moved_off_its_node(client: GfairClient, user: str, job_id: str, timeout_s: float) -> str:
    """Move the job to another server the way a failing node does: quarantine the node it runs
    on (as the failure detector would), so that node checkpoints it and another starts it from
    that checkpoint; then the operator clears the quarantine. Returns the node it left. With
    homes, a job time-slices in place on its own server and moves only when that pays, so a
    test that needs moves makes one."""
    events = [e.data for e in (await client.job(user, job_id)).events]
    seen = len(events)
    left = [e for e in events if isinstance(e, JobStarted | JobResumed)][-1].node_id
    publisher = EventPublisher(client.bus, "test")
    await publisher.publish(
        NodeQuarantined(node_id=left, reason="a test moves its jobs", recent_failures=0)
    )

    async def moved() -> bool:
        events = [e.data for e in (await client.job(user, job_id)).events]
        return any(
            isinstance(e, JobStarted | JobResumed) and e.node_id != left for e in events[seen:]
        )

    try:
        await eventually(moved, timeout_s, 0.2, what=f"{user}/{job_id} leaving {left}")
        return left
    finally:
        await client.uncordon(left, reason="the test's move is done")
