"""A real gfair cluster per test: embedded nats-server, the services and simulated nodes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gfair.client import GfairClient
from gfair.embedded_cluster import ClusterOptions, EmbeddedCluster
from node.helpers import JOB_PYTHON, reachable_tmp, sdk_on_pythonpath

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
