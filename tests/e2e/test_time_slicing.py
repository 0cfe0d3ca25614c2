"""Sharing GPUs on a real cluster: checkpoint-based time-slicing and migration."""

from __future__ import annotations

import asyncio
import time

import pytest

from gfair.bus.history import HistoricalEvent
from gfair.client import GfairClient
from gfair.events.jobs import (
    JobMigrated,
    JobPlaced,
    JobProgress,
    JobResumed,
    JobStarted,
    JobSuspended,
)
from gfair.events.reasons import SuspendReason
from gfair.events.states import JobState

from .conftest import RESNET, StartCluster, client_of, synthetic
from .test_job_life import finished, settled

pytestmark = pytest.mark.nats


def steps_after_each_start(events: tuple[HistoricalEvent, ...]) -> list[tuple[int, int]]:
    """(checkpoint step when it last let go, first progress step after it came back)."""
    pairs: list[tuple[int, int]] = []
    released: int | None = None
    waiting = False
    for event in events:
        data = event.data
        if isinstance(data, JobSuspended | JobMigrated):
            released = data.checkpoint_step
        elif isinstance(data, JobStarted | JobResumed) and released is not None:
            waiting = True
        elif isinstance(data, JobProgress) and waiting and released is not None:
            pairs.append((released, data.iterations))
            waiting = False
    return pairs


async def test_oversubscribed_jobs_time_slice_and_keep_their_progress(
    start_cluster: StartCluster,
) -> None:
    # One GPU, two jobs of ~2.5 s each: they take turns in 1 s quanta.
    async with (
        start_cluster(cluster="v100:1x1", quantum_s=1.0) as cluster,
        client_of(cluster) as client,
    ):
        began = time.monotonic()
        for name in ("a", "b"):
            await client.submit(
                "alice",
                1,
                synthetic(duration_s=25, speed_scale=10),
                job_type=RESNET,
                job_id=name,
            )
        states = await asyncio.gather(
            finished(client, "alice", "a"), finished(client, "alice", "b")
        )
        took = time.monotonic() - began
        details = [await settled(client, "alice", name) for name in ("a", "b")]
    assert list(states) == [JobState.COMPLETED, JobState.COMPLETED]
    assert took >= 4.5  # one GPU: the two ran one after the other, not side by side
    total = 25 * 7.787264918596293  # steps of 25 s on a V100
    for job in details:
        suspensions = [e.data for e in job.events if isinstance(e.data, JobSuspended)]
        assert suspensions, f"{job.job_id} was never suspended"
        assert all(s.reason is SuspendReason.TIME_SLICE for s in suspensions)
        assert all((s.checkpoint_step or 0) > 0 for s in suspensions)
        resumed = steps_after_each_start(job.events)
        assert resumed, f"{job.job_id} never came back after a suspension"
        # Each comeback continues from its checkpoint instead of starting over.
        assert all(after >= before for before, after in resumed)
        assert job.record is not None
        assert job.record.last_checkpoint_step == pytest.approx(total, abs=1)


async def test_a_migrated_job_continues_from_its_checkpoint_on_the_other_server(
    start_cluster: StartCluster,
) -> None:
    # Balance on every tick; four long jobs spread 2 + 2 over two 2-GPU servers.
    async with (
        start_cluster(
            cluster="v100:2x2", quantum_s=1.0, env={"GFAIR_BALANCE_EVERY_QUANTA": "1"}
        ) as cluster,
        client_of(cluster) as client,
    ):
        placed: dict[str, tuple[str, ...]] = {}
        for n in range(4):
            job = await client.submit(
                "alice",
                1,
                synthetic(duration_s=600, speed_scale=10),
                job_type=RESNET,
                job_id=f"j{n}",
                wait="running",
            )
            placed[job.job_id] = job.servers
        on_second = [job for job, servers in placed.items() if servers == ("v100-1",)]
        assert len(on_second) == 2, placed
        await asyncio.sleep(1.5)  # every job has checkpointed progress to take along
        for job_id in on_second:
            await client.cancel("alice", job_id)
        moved = await migration(client, [j for j in placed if j not in on_second])
        details = await client.job("alice", moved)
        for job_id in placed:
            await client.cancel("alice", job_id, wait=False)
    (migrated,) = [e.data for e in details.events if isinstance(e.data, JobMigrated)]
    assert (migrated.from_node, migrated.to_node) == ("v100-0", "v100-1")
    assert (migrated.checkpoint_step or 0) > 0
    last_placed = [e.data for e in details.events if isinstance(e.data, JobPlaced)][-1]
    assert last_placed.servers == ("v100-1",)
    after = [
        e.data
        for e in details.events
        if isinstance(e.data, JobStarted | JobResumed)
        and e.sequence > _sequence_of(details.events, migrated)
    ]
    assert [s.node_id for s in after] == ["v100-1"]
    ((before, resumed_at),) = steps_after_each_start(details.events)[-1:]
    assert resumed_at >= before


async def migration(client: GfairClient, candidates: list[str], timeout_s: float = 30) -> str:
    """The job that was migrated and restarted elsewhere (waits for both)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for job_id in candidates:
            details = await client.job("alice", job_id)
            kinds = [type(e.data) for e in details.events]
            if (
                JobMigrated in kinds
                and any(
                    kind in (JobStarted, JobResumed) for kind in kinds[kinds.index(JobMigrated) :]
                )
                and any(
                    isinstance(e.data, JobProgress) and e.data.node_id == "v100-1"
                    for e in details.events
                )
            ):
                return job_id
        await asyncio.sleep(0.2)
    raise AssertionError(f"none of {candidates} was migrated within {timeout_s}s")


def _sequence_of(events: tuple[HistoricalEvent, ...], data: object) -> int:
    return next(e.sequence for e in events if e.data is data)
