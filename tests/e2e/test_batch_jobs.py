"""A job array with %N and a dependent job on a real cluster: executors run them as processes."""
# ruff: noqa: E501  (the command lines below are kept one flag group a line)

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from gfair.events.states import JobState
from node.helpers import JOB_PYTHON

from .conftest import StartCluster, client_of

pytestmark = [pytest.mark.nats, pytest.mark.slow]

# Writes its array index and when it ran, then exits 0 (a success for the failure detector).
_JOB = (
    "import json, os, sys, time\n"
    "start = time.time(); time.sleep(1.5)\n"
    "json.dump({'index': os.environ.get('GFAIR_ARRAY_INDEX'),"
    " 'array': os.environ.get('GFAIR_ARRAY_ID'), 'start': start, 'end': time.time()},"
    " open(sys.argv[1], 'w'))\n"
)


async def test_an_array_with_a_limit_and_a_dependent_job_run_on_a_real_cluster(
    start_cluster: StartCluster, tmp_path: Path
) -> None:
    out = tmp_path / "runs"
    out.mkdir()
    out.chmod(0o777)  # the jobs write here as their tenant's account, not as the tests' user
    async with (
        start_cluster(cluster="v100:1x4", quantum_s=0.5) as cluster,
        client_of(cluster) as client,
    ):
        prep = await client.submit(
            "alice", 1, [JOB_PYTHON, "-c", _JOB, str(out / "prep.json")], job_id="prep"
        )
        assert prep.state is not JobState.REJECTED
        gfair = [sys.executable, "-m", "gfair.cli.main"]
        submit = await asyncio.create_subprocess_exec(
            *gfair, "submit", "--nats", cluster.nats_url, "--user", "alice", "--gpus", "1",
            "--array", "0-4%2", "--job-id", "sweep", "--after-ok", "prep", "--json",
            "--", JOB_PYTHON, "-c", _JOB.replace("sys.argv[1]", "sys.argv[1] + os.environ['GFAIR_ARRAY_INDEX']"),
            str(out / "sweep-"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(submit.communicate(), 60)
        assert submit.returncode == 0, stderr.decode()
        assert {j["state"] for j in json.loads(stdout)["jobs"]} == {"held"}
        wait = await asyncio.create_subprocess_exec(
            *gfair, "wait", "alice/sweep", "--nats", cluster.nats_url, "--timeout", "90",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, stderr = await asyncio.wait_for(wait.communicate(), 120)
        assert wait.returncode == 0, stderr.decode()
        for index in range(5):
            assert await client.wait("alice", f"sweep-{index}") is JobState.COMPLETED
    before = json.loads((out / "prep.json").read_text())
    runs = [json.loads((out / f"sweep-{i}").read_text()) for i in range(5)]
    assert [r["index"] for r in runs] == [str(i) for i in range(5)]
    assert {r["array"] for r in runs} == {"sweep"}
    assert all(r["start"] >= before["end"] for r in runs)  # held until prep completed
    # Four GPUs, five members, never more than two at once.
    edges = sorted([(r["start"], 1) for r in runs] + [(r["end"], -1) for r in runs])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    assert most <= 2
