"""A job's time limit on a real cluster (`gfair submit --time-limit`): split-stride stops the
job once it has run that long on GPUs, and it fails with the reason, shown by `gfair job`."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from gfair.events.jobs import JobFailed, JobStarted
from gfair.events.reasons import FailureClass
from gfair.events.states import JobState

from .conftest import RESNET, StartCluster, client_of, synthetic
from .test_job_life import finished, settled

pytestmark = pytest.mark.nats


async def test_a_job_past_its_time_limit_is_stopped_and_fails_saying_why(
    start_cluster: StartCluster,
) -> None:
    async with start_cluster(cluster="v100:1x1") as cluster:
        gfair = str(Path(sys.executable).parent / "gfair")
        url = ["--nats", cluster.nats_url]
        job = ["--user", "alice", "--gpus", "1", "--job-id", "limited", "--job-type", RESNET]
        submit = await asyncio.create_subprocess_exec(
            gfair, "submit", *url, *job, "--time-limit", "2s", "--", *synthetic(duration_s=3600)
        )
        assert await asyncio.wait_for(submit.wait(), 60) == 0
        async with client_of(cluster) as client:
            assert await finished(client, "alice", "limited") is JobState.FAILED
            details = await settled(client, "alice", "limited")
        shown = await asyncio.create_subprocess_exec(
            gfair, "job", "alice/limited", *url, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(shown.communicate(), 60)
    record = details.record
    assert record is not None and record.failure_class is FailureClass.TIME_LIMIT
    assert record.reason is not None and record.reason.startswith("time limit 2s reached after ")
    assert record.submission.time_limit == 2.0
    (failed,) = [e.data for e in details.events if isinstance(e.data, JobFailed)]
    assert failed.reason == record.reason
    assert any(isinstance(e.data, JobStarted) for e in details.events)  # it ran, then was stopped
    assert "time limit 2s reached after" in out.decode()
