"""Sharing GPUs on a real cluster: checkpoint-based time-slicing and migration."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gfair.bus.history import HistoricalEvent
from gfair.client import GfairClient
from gfair.client.views import JobDetails
from gfair.events.codec import decode
from gfair.events.jobs import (
    JobMigrated,
    JobPlaced,
    JobProgress,
    JobResumed,
    JobStarted,
    JobSuspended,
)
from gfair.events.reasons import SuspendReason
from gfair.events.scheduling import SwitchCostsUpdated
from gfair.events.states import JobState
from node.helpers import JOB_PYTHON
from support.waiting import eventually

from .conftest import FREE_MOVES, RESNET, StartCluster, client_of, synthetic
from .test_job_life import finished, settled

pytestmark = pytest.mark.nats

PREPARED_JOB = Path(__file__).parents[1] / "node" / "prepared_job.py"
PREPARED = SuspendReason.PREPARED


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
        estimates = [
            decode(m.data).data
            async for m in client.bus.history(
                "GFAIR_SCHED", filter_subjects=("gfair.sched.switch_costs",)
            )
        ]
    assert list(states) == [JobState.COMPLETED, JobState.COMPLETED]
    # Every switch measured: the profiler published each job's yield and cold start for
    # split-stride to charge it.
    for name in ("a", "b"):
        mine = [e for e in estimates if isinstance(e, SwitchCostsUpdated) and e.job_id == name]
        assert mine, f"no switch costs published for {name}"
        assert mine[-1].yield_s is not None and mine[-1].cold_start_s is not None
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
    # One V100 and one K80: the second job starts on the K80; when the V100 frees up the kernel
    # moves it there (it runs faster on it), through its checkpoint.
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
        assert (await client.job("alice", "second")).record.servers == ("k80-0",)  # type: ignore[union-attr]
        await progressed_on(client, "second", "k80-0")  # it has progress to take along
        await client.cancel("alice", "first")
        details = await progressed_on(client, "second", "v100-0")
        await client.cancel("alice", "second", wait=False)
    (suspended,) = [e.data for e in details.events if isinstance(e.data, JobSuspended)]
    assert (suspended.node_id, suspended.reason) == ("k80-0", SuspendReason.MIGRATION)
    assert (suspended.checkpoint_step or 0) > 0
    last_placed = [e.data for e in details.events if isinstance(e.data, JobPlaced)][-1]
    assert last_placed.servers == ("v100-0",)
    after = [
        e.data
        for e in details.events
        if isinstance(e.data, JobStarted | JobResumed)
        and e.sequence > _sequence_of(details.events, suspended)
    ]
    assert [s.node_id for s in after] == ["v100-0"]
    ((before, resumed_at),) = steps_after_each_start(details.events)[-1:]
    assert resumed_at >= before


async def progressed_on(
    client: GfairClient, job_id: str, node_id: str, timeout_s: float = 30
) -> JobDetails:
    """The job's details once it made progress (past step 0) on `node_id`."""

    async def progressed() -> JobDetails | None:
        details = await client.job("alice", job_id)
        on_node = [e.data for e in details.events if isinstance(e.data, JobProgress)]
        return details if any(p.node_id == node_id and p.iterations > 0 for p in on_node) else None

    return await eventually(progressed, timeout_s, 0.2, f"{job_id}'s progress on {node_id}")


def _sequence_of(events: tuple[HistoricalEvent, ...], data: object) -> int:
    return next(e.sequence for e in events if e.data is data)


async def test_a_job_not_prepared_whose_start_up_outlasts_its_slice_is_frozen_and_trains(
    start_cluster: StartCluster,
) -> None:
    # Alice's job is not opted in to prepared starts, and its start-up is 3 s of CPU work
    # against 1 s slices: killed at each slice's end, it would start anew at every slice and
    # never train. Frozen in place instead (it holds no GPU memory yet), each of its slices
    # goes on with its start-up where the last one stopped, until it comes up and trains.
    slow = (JOB_PYTHON, str(PREPARED_JOB), "3", "40", "0.05", "cpu")
    async with (
        start_cluster(cluster="v100:1x1", quantum_s=1.0) as cluster,
        client_of(cluster) as client,
    ):
        await client.submit("alice", 1, slow, job_id="slow", wait="running")
        await client.submit("bob", 1, synthetic(duration_s=3600), job_id="b")
        state = await finished(client, "alice", "slow", timeout_s=120)
        details = await settled(client, "alice", "slow")
    events = [e.data for e in details.events]
    assert state is JobState.COMPLETED, events[-5:]
    suspends = [e for e in events if isinstance(e, JobSuspended)]
    assert suspends, "it was never suspended: nothing was tested"
    assert not any(s.forced for s in suspends), "killed while it came up"
    starts = [e for e in events if isinstance(e, JobStarted)]
    assert len(starts) == 1  # one process, frozen and thawed: never started anew


async def test_a_job_whose_start_up_outlasts_its_slice_comes_up_without_a_gpu_and_trains(
    start_cluster: StartCluster,
) -> None:
    # Alice's job (opted in to prepared starts) finds the GPU idle and starts at once, but its
    # "import" (6 s) outlasts the slice and its grace (1 s + 2 s): a cold start at every slice
    # would import again each time and never train. It comes up in place instead: frozen at
    # its slice's end where the node can (it holds no GPU memory), else prepared again without
    # the GPU while bob's job has it, parking in Job.from_env() in time for its slice.
    slow = (JOB_PYTHON, str(PREPARED_JOB), "6", "40", "0.05")
    async with (
        start_cluster(cluster="v100:1x1", quantum_s=1.0) as cluster,
        client_of(cluster) as client,
    ):
        await client.submit("alice", 1, slow, job_id="slow", prepare=True, wait="running")
        await client.submit("bob", 1, synthetic(duration_s=3600), job_id="b")
        state = await finished(client, "alice", "slow", timeout_s=120)
        details = await settled(client, "alice", "slow")
    events = [e.data for e in details.events]
    assert state is JobState.COMPLETED, events[-5:]
    suspends = [e for e in events if isinstance(e, JobSuspended)]
    assert suspends, "its first slice did not end while it came up: nothing was tested"
    prepared = [e for e in events if isinstance(e, JobSuspended) and e.reason is PREPARED]
    resumed = [e for e in events if isinstance(e, JobResumed) and e.in_place]
    assert prepared or resumed, "it never came up in place"
