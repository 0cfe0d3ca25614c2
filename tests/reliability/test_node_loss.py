"""A server dies mid-job (docs/design.md §2.6; issue 5, "Must show").

Its executor and its job processes are SIGKILLed and stay dead. The failure detector moves the
node from suspected to failed and notes the job's loss as an infrastructure failure (a lost node
costs the job no attempt); placement re-places the job, which resumes on the other server from
its last checkpoint within a few quanta; when the server comes back (its executor restarts) the
node is recovered. Both jobs complete, each exactly once, and no GPU ever holds two jobs.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest

from gfair.client import GfairClient
from gfair.client.job_history import Outcomes, gpu_overlaps, job_history
from gfair.events.codec import DecodedEvent, decode
from gfair.events.jobs import JobCheckpointed, JobCompleted, JobResumed, JobStarted
from gfair.events.nodes import NodeEvent, NodeFailed, NodeRecovered
from gfair.events.reasons import FailureClass
from gfair.events.states import JobState
from gfair.events.subjects import NODES_STREAM

from .conftest import StartCluster, client_of, finished
from .workload import RESNET, STEPS_PER_S, synthetic

pytestmark = [pytest.mark.nats, pytest.mark.slow]

QUANTUM_S = 1.0


async def first(
    client: GfairClient, stream: str, test: type, where: object, timeout_s: float
) -> DecodedEvent:
    """The first event of type `test` in `stream` for which `where(data)` holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async for message in client.bus.history(stream):
            event = decode(message.data)
            if isinstance(event.data, test) and where(event.data):  # type: ignore[operator]
                return event
        await asyncio.sleep(0.2)
    raise AssertionError(f"no {test.__name__} within {timeout_s}s")


async def node_events(client: GfairClient, node_id: str) -> list[NodeEvent]:
    found = []
    async for message in client.bus.history(NODES_STREAM.name):
        data = decode(message.data).data
        if isinstance(data, NodeEvent) and data.node_id == node_id:
            found.append(data)
    return found


async def test_a_dead_nodes_job_resumes_elsewhere_and_the_node_recovers(
    start_cluster: StartCluster,
) -> None:
    # Two gangs of two on two servers of two GPUs: one on each server.
    jobs = ("a", "b")
    command = synthetic(10, checkpoint_every=int(STEPS_PER_S))  # a checkpoint every second
    async with (
        start_cluster(cluster="v100:2x2", quantum_s=QUANTUM_S) as cluster,
        client_of(cluster) as client,
    ):
        for job_id in jobs:
            await client.submit("alice", 2, command, job_type=RESNET, job_id=job_id, wait="none")
        started = await first(
            client, "GFAIR_JOBS", JobStarted, lambda d: d.job_id == "a", timeout_s=30
        )
        assert isinstance(started.data, JobStarted)
        victim = started.data.node_id
        survivor = next(n for n in cluster.node_ids if n != victim)
        await first(
            client,
            "GFAIR_JOBS",
            JobCheckpointed,
            lambda d: d.job_id == "a" and d.node_id == victim and d.step >= 2 * STEPS_PER_S,
            timeout_s=30,
        )
        killed_at = datetime.now(UTC)
        killed_jobs = cluster.kill_node(victim)
        before_kill = [
            e.data
            for e in await job_history(client.bus)
            if isinstance(e.data, JobCheckpointed) and e.data.job_id == "a"
        ]
        last_checkpoint = max(c.step for c in before_kill)

        failed = await first(
            client, NODES_STREAM.name, NodeFailed, lambda d: d.node_id == victim, timeout_s=30
        )
        resumed = await first(
            client,
            "GFAIR_JOBS",
            JobResumed,
            lambda d: d.job_id == "a" and d.node_id == survivor,
            timeout_s=30,
        )
        cluster.children.revive(victim)
        back_in_s = await cluster.wait_serving(victim, since=datetime.now(UTC))
        await first(
            client, NODES_STREAM.name, NodeRecovered, lambda d: d.node_id == victim, timeout_s=30
        )
        states = await asyncio.gather(*(finished(client, "alice", j, 120) for j in jobs))
        history = await job_history(client.bus)
        failures = (await client.job("alice", "a")).failures
        lifecycle = [type(e).__name__ for e in await node_events(client, victim)]

    assert killed_jobs >= 1, "the dead server's job process was not found"
    assert states == [JobState.COMPLETED, JobState.COMPLETED]
    # Suspected, then failed, then recovered, in that order.
    after_kill = lifecycle[lifecycle.index("NodeSuspected") :]
    assert [k for k in after_kill if k in ("NodeSuspected", "NodeFailed", "NodeRecovered")][:3] == [
        "NodeSuspected",
        "NodeFailed",
        "NodeRecovered",
    ], lifecycle
    assert isinstance(failed.data, NodeFailed)
    assert ("alice", "a") in {(j.user, j.job_id) for j in failed.data.jobs}
    assert failed.envelope.time > killed_at

    outcomes = Outcomes.of(history)
    assert outcomes.problems({("alice", j) for j in jobs}) == []
    assert failures is not None
    (lost,) = [d for d in failures.decisions if d.outcome == "node_lost"]
    assert lost.failure_class is FailureClass.INFRASTRUCTURE and lost.node_id == victim
    # Resumed from its last checkpoint, not from scratch (a later one may have been written
    # between the last report and the kill).
    assert isinstance(resumed.data, JobResumed)
    step = resumed.data.checkpoint_step
    assert step is not None and step >= last_checkpoint > 0
    # Re-placed within a few quanta of the node being declared dead.
    delay_s = (resumed.envelope.time - failed.envelope.time).total_seconds()
    assert delay_s < 5 * QUANTUM_S, f"resumed {delay_s:.1f}s after the failure"
    done = outcomes.end(("alice", "a"))
    assert isinstance(done, JobCompleted) and done.attempt == 1
    assert outcomes.retries[("alice", "a")] == []
    overlaps, _ = gpu_overlaps(history)
    assert overlaps == []
    assert back_in_s < 30
    print(
        f"\nnode loss: {victim} failed {(failed.envelope.time - killed_at).total_seconds():.1f}s "
        f"after the kill; job a resumed on {survivor} {delay_s:.1f}s later from step "
        f"{step} (last reported checkpoint {last_checkpoint}); "
        f"the executor served again {back_in_s:.1f}s after its restart"
    )
