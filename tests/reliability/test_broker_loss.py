"""A broker dies mid-workload (docs/design.md §3.5; issue 5, "Must show").

Three nats-servers form one JetStream cluster; every stream and bucket has three replicas and
every process knows all three URLs. One broker is SIGKILLed while jobs run and submissions keep
coming: no stored event is lost, every job completes exactly once, the services reconnect by
themselves (none of them dies), and the broker rejoins when it is started again.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from functools import partial

import pytest

from gfair.client import GfairClient
from gfair.client.job_history import Outcomes, gpu_overlaps, job_history, story
from gfair.embedded_cluster import SCHEDULER_SERVICES
from gfair.events.states import JobState
from gfair.events.subjects import JOBS_STREAM
from gfair.state.buckets import JOBS, STRIDE
from support.waiting import eventually

from .conftest import StartCluster, client_of, finished, patiently
from .workload import RESNET, synthetic

pytestmark = [pytest.mark.nats, pytest.mark.slow]


async def stored(client: GfairClient) -> set[bytes]:
    async def read() -> set[bytes]:
        return {m.data async for m in client.bus.history(JOBS_STREAM.name)}

    return await patiently(read)


async def any_running(client: GfairClient, jobs: list[str]) -> bool:
    return any([(await client.job("alice", j)).state == JobState.RUNNING for j in jobs])


async def test_losing_one_of_three_brokers_loses_no_event_and_no_job(
    start_cluster: StartCluster,
) -> None:
    early = [f"early-{n}" for n in range(6)]
    late = [f"late-{n}" for n in range(6)]
    async with (
        start_cluster(cluster="v100:2x2", quantum_s=1.0, brokers=3) as cluster,
        client_of(cluster) as client,
    ):
        assert len(cluster.broker_urls) == 3
        js = client.bus.client.jetstream()  # type: ignore[attr-defined]
        replicas = {
            name: (await js.stream_info(name)).config.num_replicas
            for name in (JOBS_STREAM.name, f"KV_{JOBS.name}", f"KV_{STRIDE.name}")
        }
        # Every process was told: each declares the same R3 topology.
        assert {c.env["GFAIR_REPLICAS"] for c in cluster.children.values()} == {"3"}
        for index, job_id in enumerate(early):
            gpus = 2 if index % 3 == 0 else 1
            await client.submit("alice", gpus, synthetic(3), job_type=RESNET, job_id=job_id)
        # Mid-workload: a job runs (and others wait or are suspended).
        await eventually(lambda: any_running(client, early), 60)
        before = await stored(client)
        killed_at = time.monotonic()
        killed_when = datetime.now(UTC)
        await cluster.brokers.kill(0)
        # Submissions go on while the cluster elects new leaders.
        for job_id in late:
            await patiently(
                partial(
                    client.submit,
                    "bob",
                    1,
                    synthetic(2),
                    job_type=RESNET,
                    job_id=job_id,
                    wait="none",
                )
            )
        waits = [("alice", j) for j in early] + [("bob", j) for j in late]
        ends = await asyncio.gather(
            *(finished(client, user, job_id, 120) for user, job_id in waits),
            return_exceptions=True,
        )
        stuck = [job for job, end in zip(waits, ends, strict=True) if not isinstance(end, JobState)]
        if stuck:
            # What the stream and the scheduler say of each, for whoever reads a red run.
            history = await patiently(partial(job_history, client.bus))
            lines = [line for job in stuck for line in [str(job), *story(history, job)]]
            for user, job_id in stuck:
                lines.append(f"why {user}/{job_id}: {await client.why(user, job_id)}")
            raise AssertionError("did not finish within 120 s:\n" + "\n".join(lines))
        states = [end for end in ends if isinstance(end, JobState)]
        unfinished = [
            job for job, end in zip(waits, ends, strict=True) if end != JobState.COMPLETED
        ]
        if unfinished:  # with their stories, for whoever reads a red run
            history = await patiently(partial(job_history, client.bus))
            lines = [line for job in unfinished for line in [str(job), *story(history, job)]]
            raise AssertionError("did not complete:\n" + "\n".join(lines))
        all_done_s = time.monotonic() - killed_at
        # Every service pulls from its consumers again, on its own connection.
        for name in SCHEDULER_SERVICES:
            await cluster.wait_serving(name, since=killed_when, timeout_s=30)
        await cluster.brokers.restart(0)
        after = await stored(client)
        history = await patiently(partial(job_history, client.bus))
        restarts = {n: c.restarts for n, c in cluster.children.items() if c.restarts}

    assert set(replicas.values()) == {3}, replicas
    assert states == [JobState.COMPLETED] * (len(early) + len(late))
    assert before <= after, f"{len(before - after)} stored events lost with the broker"
    expected = {("alice", j) for j in early} | {("bob", j) for j in late}
    assert Outcomes.of(history).problems(expected) == []
    overlaps, _ = gpu_overlaps(history)
    if overlaps:  # with both jobs' stories, for whoever reads a red run
        lines = [str(overlaps)]
        for overlap in overlaps:
            for job in (overlap.holder, overlap.intruder):
                user, job_id = job.split("/", 1)
                lines += [job, *story(history, (user, job_id))]
        raise AssertionError("\n".join(lines))
    # Nobody was restarted: every process rode out the loss on its own connection.
    assert restarts == {}
    print(
        f"\nbroker loss: {len(before)} events stored before the kill, all kept; "
        f"{len(expected)} jobs completed {all_done_s:.1f}s after it"
    )
