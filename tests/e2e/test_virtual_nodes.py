"""A cluster of virtual nodes (`gfair up --virtual`): the services run it as any other.

Twenty servers in two executor processes, no process per job: two users' jobs share them by
their tickets and complete, suspended on a node of one process and resumed from their
checkpoints on a node of either, as on a cluster of real executors.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest

from gfair.client import GfairClient
from gfair.embedded_cluster import virtual_nodes_child
from gfair.events.states import JobState
from gfair.state.stride_record import StrideRecord
from support.waiting import eventually

from .conftest import RESNET, StartCluster, client_of, synthetic

pytestmark = [pytest.mark.nats, pytest.mark.slow]

TICKETS = {"alice": 2.0, "bob": 1.0}
JOBS_EACH = 30  # 60 one-GPU jobs on 40 GPUs: saturated until a third of them are done
WINDOW_S = 6.0


async def every_user_ran(client: GfairClient) -> dict[str, float] | None:
    """Each user's usage, once every one has had GPU time (no ledger before the first quantum)."""
    if await client.stride() is None:
        return None
    used = await usage(client)
    return used if all(used.values()) else None


async def usage(client: GfairClient) -> dict[str, float]:
    record: StrideRecord | None = await client.stride()
    assert record is not None
    return {user: record.usage_of(user) for user in TICKETS}


async def test_two_users_share_twenty_virtual_servers_by_tickets_and_their_jobs_complete(
    start_cluster: StartCluster,
) -> None:
    async with (
        start_cluster(
            cluster="v100:20x2",
            quantum_s=1.0,
            user_tickets=TICKETS,
            virtual=True,
            virtual_per_process=10,
        ) as cluster,
        client_of(cluster) as client,
    ):
        # Twenty servers, ten in each of two processes.
        assert len(cluster.node_ids) == 20
        executors = [c for c in cluster.children.values() if c.module == "node_executor"]
        assert [c.name for c in executors] == [virtual_nodes_child(0), virtual_nodes_child(1)]
        assert {n.node_id for n in await client.nodes()} == set(cluster.node_ids)
        # 12 s of V100 training each (120 s at speed 10).
        for n in range(JOBS_EACH):
            for user in TICKETS:
                await client.submit(
                    user,
                    1,
                    synthetic(duration_s=120, speed_scale=10),
                    job_type=RESNET,
                    job_id=f"{user}-{n}",
                )
        # Every user has had GPU time: the jobs are placed and the first quanta past.
        before = await eventually(lambda: every_user_ran(client), 60)
        await asyncio.sleep(WINDOW_S)  # pause under test: the window the shares are measured in
        after = await usage(client)
        received = {user: after[user] - before[user] for user in TICKETS}
        total = sum(received.values())
        # Forty GPUs held the whole window, give or take a quantum at either end.
        assert total == pytest.approx(40 * WINDOW_S, rel=0.25)
        assert received["alice"] / total == pytest.approx(2 / 3, abs=0.1), received

        deadline = time.monotonic() + 120.0
        while True:
            jobs = await client.jobs()
            done = [j for j in jobs if j.state is JobState.COMPLETED]
            if len(done) == 2 * JOBS_EACH or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)
        states = {f"{j.user}/{j.job_id}": j.state for j in jobs}
        assert len(done) == 2 * JOBS_EACH, states
        # Time-sliced on the way: suspended and resumed from their checkpoints, not restarted.
        details = await client.job("bob", "bob-0")
        kinds = [type(e.data).__name__ for e in details.events]
        assert kinds.count("JobExited") == 1 and "JobSuspended" in kinds


async def test_a_virtual_node_and_a_killed_service_are_waited_for_until_they_serve_again(
    start_cluster: StartCluster,
) -> None:
    async with start_cluster(
        cluster="v100:3x2", quantum_s=1.0, virtual=True, virtual_per_process=2
    ) as cluster:
        first, second = (
            cluster.children[virtual_nodes_child(0)],
            cluster.children[virtual_nodes_child(1)],
        )
        killed_at = datetime.now(UTC)
        cluster.children.kill(second.name)
        # A server of the virtual cluster serves once the restarted process registered it: the
        # third server runs in the second process, restarted alone.
        await cluster.wait_serving("v100-2", since=killed_at, timeout_s=60)
        assert second.starts == 2 and second.started_at is not None
        assert second.started_at > killed_at
        assert first.starts == 1 and first.alive

        split_stride = cluster.children["split_stride"]
        killed_at = datetime.now(UTC)
        cluster.children.kill("split_stride")
        # Not the killed process's unexpired pulls: the new process's own.
        await cluster.wait_serving("split_stride", since=killed_at, timeout_s=60)
        assert split_stride.starts == 2 and split_stride.alive
        assert split_stride.started_at is not None and split_stride.started_at > killed_at
        with pytest.raises(KeyError):
            await cluster.wait_serving("v100-9", since=killed_at, timeout_s=1)
