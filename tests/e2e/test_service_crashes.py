"""SIGKILLed services come back; nothing is lost or run twice (docs/design.md §2.6, §3.3)."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from gfair.client import GfairClient
from gfair.client.errors import UnknownJob
from gfair.events.codec import decode
from gfair.events.jobs import JobExited, JobMigrated, JobResumed, JobStarted, JobSuspended
from gfair.events.states import JobState
from gfair.events.subjects import JOBS_STREAM
from support.waiting import eventually

from .conftest import RESNET, StartCluster, client_of, synthetic
from .test_job_life import finished

pytestmark = [pytest.mark.nats, pytest.mark.slow]


async def all_in(client: GfairClient, jobs: list[str], state: JobState) -> bool:
    return all([(await client.job("alice", j)).state == state for j in jobs])


async def all_admitted(client: GfairClient, jobs: list[str]) -> bool:
    try:
        return all([(await client.job("alice", j)).record is not None for j in jobs])
    except UnknownJob:  # no record yet: placement has not admitted it
        return False


async def test_killing_placement_and_split_stride_loses_no_job_and_shares_no_gpu(
    start_cluster: StartCluster,
) -> None:
    async with (
        start_cluster(cluster="v100:1x2", quantum_s=1.0) as cluster,
        client_of(cluster) as client,
    ):
        jobs = [f"j{n}" for n in range(4)]
        for job_id in jobs[:2]:
            await client.submit(
                "alice",
                1,
                synthetic(duration_s=25, speed_scale=10),
                job_type=RESNET,
                job_id=job_id,
            )
        await eventually(lambda: all_in(client, jobs[:2], JobState.RUNNING), 60)
        cluster.children.kill("split_stride")
        for job_id in jobs[2:]:  # submitted while placement is down and coming back
            cluster.children.kill("placement")
            await client.submit(
                "alice",
                1,
                synthetic(duration_s=25, speed_scale=10),
                job_type=RESNET,
                job_id=job_id,
                wait="none",
            )
        await eventually(lambda: all_admitted(client, jobs), 60)  # placement is back
        cluster.children.kill("split_stride")
        states = await asyncio.gather(*(finished(client, "alice", j, 90) for j in jobs))
        history = [decode(m.data) async for m in client.bus.history(JOBS_STREAM.name)]
    assert states == [JobState.COMPLETED] * 4
    # Replay the node's reports: a GPU index is never held by two jobs at once.
    held: dict[int, str] = {}
    holding: dict[str, tuple[int, ...]] = defaultdict(tuple)
    for event in history:
        data = event.data
        if isinstance(data, JobStarted | JobResumed):
            for index in data.gpu_indices:
                assert held.get(index) in (None, data.job_id), (
                    f"{data.job_id} started on GPU {index} held by {held[index]}"
                )
                held[index] = data.job_id
            holding[data.job_id] = data.gpu_indices
        elif isinstance(data, JobSuspended | JobExited | JobMigrated):
            for index in holding.pop(data.job_id, ()):
                held.pop(index, None)
    assert cluster.children["split_stride"].starts == 3
