"""The retry policy on a live cluster (docs/design.md §2.6; issue 5, "Must show").

A job that fails by itself (its own exit code, or out of GPU memory) is retried within its
class's budget, one retry by default, then fails for good with the reason; a job hit by an
infrastructure fault (its GPU fell off the bus) is retried and succeeds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gfair.client.job_history import Outcomes, gpu_overlaps, job_history
from gfair.events.jobs import JobCompleted, JobFailed, JobStarted
from gfair.events.reasons import FailureClass
from gfair.events.states import JobState
from support.jobs import settled

from .conftest import StartCluster, client_of, finished
from .workload import RESNET, flaky, synthetic

pytestmark = [pytest.mark.nats, pytest.mark.slow]


async def test_user_errors_stop_after_their_budget_and_infrastructure_faults_are_retried(
    start_cluster: StartCluster, tmp_path: Path
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    markers.chmod(0o777)  # the flaky job leaves its marker as its tenant's account
    jobs = {
        "exits-3": synthetic(4, fail_at_step=2),
        "oom": synthetic(4, oom_at_step=1),
        "gpu-fault": flaky(markers / "gpu-fault.marker", 2),
    }
    async with start_cluster(cluster="v100:2x2") as cluster, client_of(cluster) as client:
        for job_id, command in jobs.items():
            await client.submit("alice", 1, command, job_type=RESNET, job_id=job_id, wait="none")
        states = await asyncio.gather(*(finished(client, "alice", j, 90) for j in jobs))
        records = {j: (await settled(client, "alice", j, 20, 0.2)).record for j in jobs}
        history = await job_history(client.bus)
    assert dict(zip(jobs, states, strict=True)) == {
        "exits-3": JobState.FAILED,
        "oom": JobState.FAILED,
        "gpu-fault": JobState.COMPLETED,
    }
    outcomes = Outcomes.of(history)
    assert outcomes.problems({("alice", j) for j in jobs}) == []

    # A deterministic error: one retry (the default budget), then failed with its reason.
    (retry,) = outcomes.retries[("alice", "exits-3")]
    assert retry.failure_class is FailureClass.USER_ERROR and retry.attempt == 2
    failed = outcomes.end(("alice", "exits-3"))
    assert isinstance(failed, JobFailed)
    assert (failed.failure_class, failed.attempt, failed.exit_code) == (
        FailureClass.USER_ERROR,
        2,
        3,
    )
    assert "exit code 3" in failed.reason and "injected failure at step 2" in failed.reason

    (retry,) = outcomes.retries[("alice", "oom")]
    assert retry.failure_class is FailureClass.OUT_OF_MEMORY
    oom = outcomes.end(("alice", "oom"))
    assert isinstance(oom, JobFailed) and oom.failure_class is FailureClass.OUT_OF_MEMORY
    assert "out of memory" in oom.reason.lower()

    # The GPU fault is not the job's doing: retried, and the retry runs to the end.
    (retry,) = outcomes.retries[("alice", "gpu-fault")]
    assert retry.failure_class is FailureClass.INFRASTRUCTURE and "Xid" in retry.reason
    done = outcomes.end(("alice", "gpu-fault"))
    assert isinstance(done, JobCompleted) and done.attempt == 2
    attempts = [
        e.data.attempt
        for e in history
        if isinstance(e.data, JobStarted) and e.data.job_id == "gpu-fault"
    ]
    assert attempts == [1, 2]

    # The records agree with the events; nothing ever shared a GPU.
    assert {j: r.state if r else None for j, r in records.items()} == {
        "exits-3": JobState.FAILED,
        "oom": JobState.FAILED,
        "gpu-fault": JobState.COMPLETED,
    }
    overlaps, _ = gpu_overlaps(history)
    assert overlaps == []
