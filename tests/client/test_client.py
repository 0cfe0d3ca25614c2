"""The Python client against a real nats-server running the control-plane services."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gfair.bus.server import EmbeddedNatsServer
from gfair.client import (
    ClientError,
    GfairClient,
    InvalidRequest,
    NoCluster,
    NotReachable,
    UnknownJob,
    WaitTimeout,
)
from gfair.events.jobs import JobAccepted, JobCancelled, JobPlaced
from gfair.events.reasons import RejectionCode
from gfair.events.states import JobState
from support.waiting import eventually

from .live_cluster import control_plane, registration

pytestmark = pytest.mark.nats

SYNTHETIC = ["python", "-m", "gfair.sdk.synthetic", "--iterations", "10"]


@pytest.fixture
async def client(nats_url: str) -> AsyncIterator[GfairClient]:
    async with (
        control_plane(nats_url, registration("v100-0", "v100"), registration("k80-0", "k80")),
        await GfairClient.connect(nats_url, poll_interval_s=0.05) as found,
    ):
        yield found


async def test_a_submission_is_accepted_and_visible_in_the_job_list(client: GfairClient) -> None:
    submitted = await client.submit(
        "alice", 2, SYNTHETIC, name="resnet", job_type="ResNet-50 (batch size 32)"
    )
    assert submitted.state in (JobState.QUEUED, JobState.PLACED)
    assert submitted.job_id.startswith("resnet-")
    assert not submitted.rejected

    async def listed() -> bool:
        return any(r.job_id == submitted.job_id for r in await client.jobs(user="alice"))

    await eventually(listed)
    (record,) = await client.jobs(user="alice")
    assert (record.user, record.gpus, record.submission.command) == (
        "alice",
        2,
        tuple(SYNTHETIC),
    )
    assert await client.jobs(user="bob") == []
    assert await client.jobs(state=JobState.COMPLETED) == []

    async def placed() -> bool:
        details = await client.job("alice", submitted.job_id)
        return any(isinstance(e.data, JobPlaced) for e in details.events)

    await eventually(placed)
    details = await client.job("alice", submitted.job_id)
    kinds = [type(e.data) for e in details.events]
    assert kinds[:2] == [JobAccepted, JobPlaced]
    assert details.record is not None and details.record.generation in ("v100", "k80")


async def test_a_reused_job_id_is_rejected_and_the_wait_sees_only_the_new_answer(
    client: GfairClient,
) -> None:
    first = await client.submit("alice", 1, SYNTHETIC, job_id="train")
    assert first.state in (JobState.QUEUED, JobState.PLACED)
    again = await client.submit("alice", 1, SYNTHETIC, job_id="train")
    assert again.rejected
    assert again.code is RejectionCode.DUPLICATE_JOB_ID
    # The first job is untouched by the rejected duplicate.
    details = await client.job("alice", "train", with_events=False)
    assert details.state in (JobState.QUEUED, JobState.PLACED)
    # An impossible gang is rejected with the reason.
    huge = await client.submit("alice", 64, SYNTHETIC)
    assert huge.rejected and huge.reason


async def test_cancel_ends_the_job_and_leaves_finished_jobs_alone(client: GfairClient) -> None:
    submitted = await client.submit("alice", 1, SYNTHETIC)
    assert await client.cancel("alice", submitted.job_id, reason="changed my mind") == (
        JobState.CANCELLED
    )
    details = await client.job("alice", submitted.job_id)
    assert any(isinstance(e.data, JobCancelled) for e in details.events)

    async def recorded() -> bool:
        return (await client.job("alice", submitted.job_id)).state is JobState.CANCELLED

    await eventually(recorded)
    # Cancelling again publishes nothing and answers the final state.
    events = len(details.events)
    assert await client.cancel("alice", submitted.job_id) is JobState.CANCELLED
    assert len((await client.job("alice", submitted.job_id)).events) == events
    with pytest.raises(UnknownJob):
        await client.cancel("alice", "no-such-job")


async def test_users_show_entitlements_of_active_users(client: GfairClient) -> None:
    for user in ("alice", "bob"):
        await client.submit(user, 1, SYNTHETIC, job_type="ResNet-50 (batch size 32)")

    async def both() -> bool:
        view = await client.users()
        return {u.user for u in view.users if u.entitled > 0} == {"alice", "bob"}

    await eventually(both)
    view = await client.users()
    assert view.capacity == {"k80": 4, "v100": 4}
    for user in view.users:
        assert user.demand == 1 and user.jobs == 1
        assert user.entitled == pytest.approx(1.0)  # water-filled: each asks for one GPU


async def test_why_explains_a_waiting_job(client: GfairClient) -> None:
    submitted = await client.submit("alice", 1, SYNTHETIC)
    explanation = await client.why("alice", submitted.job_id)
    assert explanation.headline.startswith(f"alice/{submitted.job_id}")
    assert explanation.state in (JobState.QUEUED, JobState.PLACED)
    assert any(r.kind == "history" for r in explanation.reasons)


async def test_watch_follows_a_job_until_it_ends(client: GfairClient) -> None:
    submitted = await client.submit("alice", 1, SYNTHETIC, wait="none")
    seen: list[str] = []

    async def follow() -> None:
        async for event in client.watch("alice", submitted.job_id, timeout_s=20):
            seen.append(event.envelope.type)

    watcher = asyncio.create_task(follow())
    await eventually(lambda: "gfair.job.accepted.v1" in seen)
    await client.cancel("alice", submitted.job_id, wait=False)
    await asyncio.wait_for(watcher, 20)
    assert seen[0] == "gfair.job.accepted.v1"
    assert seen[-1] == "gfair.job.cancelled.v1"


async def test_bad_requests_fail_before_anything_is_published(client: GfairClient) -> None:
    with pytest.raises(InvalidRequest, match="user"):
        await client.submit("not a token", 1, SYNTHETIC)
    with pytest.raises(InvalidRequest, match="gpus"):
        await client.submit("alice", 0, SYNTHETIC)
    with pytest.raises(UnknownJob):
        await client.job("alice", "never-submitted")
    with pytest.raises(ClientError, match="unknown node"):
        await client.uncordon("no-such-node")
    assert await client.jobs() == []


async def test_waiting_for_a_state_that_never_comes_times_out(client: GfairClient) -> None:
    # No node executor runs here: a job is placed but never starts.
    with pytest.raises(WaitTimeout, match="not running"):
        await client.submit("alice", 1, SYNTHETIC, wait="running", timeout_s=1.0)


async def test_no_server_and_no_cluster_are_told_apart(
    nats_server: EmbeddedNatsServer,
) -> None:
    with pytest.raises(NotReachable, match="cannot reach NATS"):
        await GfairClient.connect("nats://127.0.0.1:1")
    # A NATS without a gfair cluster on it: no streams, no buckets.
    async with await GfairClient.connect(nats_server.url) as client:
        with pytest.raises(NoCluster, match="gfair_jobs"):
            await client.jobs()
        with pytest.raises(NoCluster):
            await client.submit("alice", 1, SYNTHETIC)
