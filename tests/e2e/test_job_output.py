"""A job's stdout on a real cluster: shipped by each executor it ran on, read back after it
moved, with the node and run of each piece (`gfair logs`)."""

from __future__ import annotations

import asyncio
import time

import pytest

from gfair.bus.job_output import OutputChunk, read_output
from gfair.client import GfairClient

from .conftest import FREE_MOVES, RESNET, StartCluster, client_of, synthetic
from .test_time_slicing import progressed_on

pytestmark = pytest.mark.nats


async def output_of(client: GfairClient, job_id: str) -> list[OutputChunk]:
    return [c async for c in read_output(client.bus, "alice", job_id)]


def stdout_by_node(chunks: list[OutputChunk]) -> dict[str, str]:
    found: dict[str, str] = {}
    for chunk in chunks:
        if chunk.output == "stdout" and not chunk.end:
            found[chunk.node] = found.get(chunk.node, "") + chunk.data.decode()
    return found


async def test_the_output_of_a_migrated_job_comes_from_both_nodes(
    start_cluster: StartCluster,
) -> None:
    # As in test_time_slicing: the second job starts on the K80 and moves to the V100.
    async with (
        start_cluster(cluster="v100:1x1,k80:1x1", quantum_s=1.0, env=FREE_MOVES) as cluster,
        client_of(cluster) as client,
    ):
        for job_id in ("first", "second"):
            await client.submit(
                "alice",
                1,
                synthetic(duration_s=600, speed_scale=10),
                job_type=RESNET,
                job_id=job_id,
                wait="running",
            )
        await progressed_on(client, "second", "k80-0")
        await client.cancel("alice", "first")
        await progressed_on(client, "second", "v100-0")
        # The K80's last lines may be shipped after the V100's first (each executor ships its
        # own run's output): wait for what is asserted below.
        deadline = time.monotonic() + 30
        while not _from_both(by_node := stdout_by_node(await output_of(client, "second"))):
            assert time.monotonic() < deadline, f"output so far: {by_node}"
            await asyncio.sleep(0.5)
        await client.cancel("alice", "second", wait=False)
    # What it printed on the K80, up to yielding for the move, and on the V100 after.
    assert "on 1xk80" in by_node["k80-0"] and "synthetic job: yielding at step" in by_node["k80-0"]
    assert "on 1xv100" in by_node["v100-0"]


def _from_both(by_node: dict[str, str]) -> bool:
    """The K80's run up to its yield and the V100's run are both in."""
    return "synthetic job: yielding at step" in by_node.get("k80-0", "") and bool(
        by_node.get("v100-0")
    )
