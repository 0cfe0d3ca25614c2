"""A tenant whose jobs ignore their yields (issue 23, "Tenants who attack", item 3), on a real
cluster: its job is forced off its GPUs soon after the grace the suspend carries, its owner is
told why it lost its progress, and the other tenant's job runs within a few quanta and gets
about its share beside the hostile gang (docs/design.md §1.3). A job that never comes up (no
mini-batch ever) and ignores every signal is frozen in place at its slice's end instead,
holding no GPU: it gains nothing by it either."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from e2e.conftest import (
    JOB_PYTHON,
    StartCluster,
    client_of,
    sdk_for_jobs,
    start_cluster,
    synthetic,
)
from gfair.client import GfairClient
from gfair.client.switching import seconds_held
from gfair.client.views import JobDetails
from gfair.events.jobs import JobExited, JobSuspended
from gfair.events.states import JobState

pytestmark = pytest.mark.nats

QUANTUM_S = 5.0
GRACE_S = 2.0  # split-stride's default for this quantum: max(2 s, a quarter of it)
# Its whole GPU-holding server for as long as it can: it trains a few mini-batches (it came
# up), then ignores SIGUSR1 (the SDK's yield) and SIGTERM; only SIGKILL stops it.
IGNORES_YIELDS = [JOB_PYTHON, str(Path(__file__).parents[1] / "node" / "yield_ignoring_job.py")]
# Never a mini-batch, every signal it can ignore ignored.
NEVER_COMES_UP = ["sh", "-c", 'trap "" USR1 TERM; sleep 600']
# Bob's job yields at its next mini-batch when told, as the SDK's jobs do.
BOBS_JOB = synthetic(duration_s=6000)

__all__ = ["sdk_for_jobs", "start_cluster"]  # fixtures, used by name


async def running(client: GfairClient, user: str, job_id: str, timeout_s: float) -> float:
    """Wait until the job runs; the monotonic time it was seen running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        details = await client.job(user, job_id, with_events=False)
        if details.state is JobState.RUNNING:
            return time.monotonic()
        await asyncio.sleep(0.1)
    raise AssertionError(f"{user}/{job_id} did not run within {timeout_s:g}s")


async def hostile_beside_bob(client: GfairClient, hog: list[str] = IGNORES_YIELDS) -> float:
    """Alice's hostile gang holds the whole server; then bob submits one GPU's job. Returns
    how long bob's job waited to run."""
    await client.submit("alice", 4, hog, job_id="hog")
    await running(client, "alice", "hog", timeout_s=60)
    await asyncio.sleep(QUANTUM_S)  # pause under test: it has held the server for a quantum
    submitted = time.monotonic()
    await client.submit("bob", 1, BOBS_JOB, job_id="b")
    return await running(client, "bob", "b", timeout_s=120) - submitted


@pytest.mark.timeout(300)
async def test_a_job_ignoring_its_yield_is_forced_off_and_its_owner_told_why(
    start_cluster: StartCluster,
) -> None:
    async with (
        start_cluster(cluster="v100:1x4", quantum_s=QUANTUM_S) as cluster,
        client_of(cluster) as client,
    ):
        waited = await hostile_beside_bob(client)
        hog = await client.job("alice", "hog")
        why = await client.why("alice", "hog")
    forced = [e.data for e in hog.events if isinstance(e.data, JobSuspended) and e.data.forced]
    assert forced, "the hog's suspend was never reported as forced"
    # Forced off within its grace and a margin (before: 30 s, then SIGTERM's 5 s).
    first = forced[0]
    assert first.duration_s is not None and first.duration_s < GRACE_S + 3.0
    assert first.overrun_s is not None
    assert first.checkpoint_step is None  # it never checkpointed: it restarts from scratch
    # Its owner reads why it lost its progress.
    assert any("forced off" in reason.text for reason in why.reasons)
    # Bob was owed from the tick after he arrived: he runs within three quanta.
    assert waited < 3 * QUANTUM_S


@pytest.mark.timeout(300)
async def test_a_well_behaved_job_gets_its_share_beside_a_gang_that_ignores_its_yields(
    start_cluster: StartCluster,
) -> None:
    window_s = 16 * QUANTUM_S
    async with (
        start_cluster(cluster="v100:1x4", quantum_s=QUANTUM_S) as cluster,
        client_of(cluster) as client,
    ):
        await hostile_beside_bob(client)
        began = time.time()
        await asyncio.sleep(window_s)
        ended = time.time()
        bob = await client.job("bob", "b")
        hog = await client.job("alice", "hog")
    held = seconds_held(bob.events, began, ended)
    # Bob's one GPU against alice's 4-GPU gang on one 4-GPU server: while bob runs, the three
    # GPUs beside him fit no job of alice's, who then runs nothing and saves up, so the two
    # alternate at worst, and alice is charged what her gang holds past its yields. Before,
    # her gang held the server 35 s per cycle and bob ran about 5 s of every 40.
    share = held / (ended - began)
    assert share > 0.35, f"bob ran {share:.0%} of the window\n" + "\n".join(
        _lines(bob) + _lines(hog)
    )


@pytest.mark.timeout(300)
async def test_a_job_that_never_comes_up_is_frozen_at_its_slices_end_holding_no_gpu(
    start_cluster: StartCluster,
) -> None:
    async with (
        start_cluster(cluster="v100:1x4", quantum_s=QUANTUM_S) as cluster,
        client_of(cluster) as client,
    ):
        waited = await hostile_beside_bob(client, NEVER_COMES_UP)
        hog = await client.job("alice", "hog")
    suspends = [e.data for e in hog.events if isinstance(e.data, JobSuspended)]
    assert suspends, "the hog was never suspended"
    # Frozen where it was, at once: no grace waited out, nothing forced.
    assert all(s.in_place and not s.forced for s in suspends), suspends
    assert all(s.duration_s is not None and s.duration_s < 1.0 for s in suspends)
    # Bob was owed from the tick after he arrived: he runs within three quanta.
    assert waited < 3 * QUANTUM_S


def _lines(details: JobDetails) -> list[str]:
    """A job's events, one line each, with how each exit ended: what a red run shows."""
    lines = []
    for event in details.events:
        data = event.data
        said = ""
        if isinstance(data, JobExited):
            said = f"exit {data.exit_code} signal {data.signal}: {data.stderr_tail[-400:]!r}"
        elif isinstance(data, JobSuspended):
            said = f"forced {data.forced} in {data.duration_s}"
        lines.append(
            f"{details.job_id} {event.envelope.time:%H:%M:%S.%f} {type(data).__name__} {said}"
        )
    return lines
