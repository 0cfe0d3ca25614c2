"""A job's life on a real embedded cluster is one trace across the services (`gfair trace`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gfair.cli.main import main
from gfair.client import GfairClient
from gfair.embedded_cluster import ClusterOptions, EmbeddedCluster
from gfair.events.states import JobState

pytestmark = [pytest.mark.nats, pytest.mark.slow]

RESNET = "ResNet-50 (batch size 32)"


def synthetic(duration_s: float) -> list[str]:
    """The synthetic job: `duration_s` of V100 training, run ten times faster."""
    return [
        sys.executable,
        "-m",
        "gfair.sdk.synthetic",
        "--job-type",
        RESNET,
        "--duration-s",
        f"{duration_s:g}",
        "--speed-scale",
        "10",
    ]


async def run_jobs(cluster: EmbeddedCluster, jobs: dict[tuple[str, str], float]) -> None:
    """Submit every (user, job id) with its training length; wait until all completed."""
    client = await GfairClient.connect(cluster.nats_url, poll_interval_s=0.05)
    async with client:
        for (user, job_id), duration_s in jobs.items():
            await client.submit(user, 1, synthetic(duration_s), job_id=job_id, job_type=RESNET)
        for user, job_id in jobs:
            final = None
            async for event in client.watch(user, job_id, timeout_s=90):
                state = getattr(event.data, "JOB_STATE", None)
                if state is not None and JobState(state).terminal:
                    final = JobState(state)
            assert final is JobState.COMPLETED, f"{user}/{job_id} ended {final}"


def gfair_trace(job: str, span_file: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["trace", job, "--json", "--span-file", str(span_file)]) == 0
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    return document


def assert_causal(spans: list[dict[str, Any]]) -> None:
    ids = {s["span_id"] for s in spans}
    seen: set[str] = set()
    for span in spans:
        if span["parent_span_id"] in ids:
            assert span["parent_span_id"] in seen, f"{span['name']} listed before its parent"
        seen.add(span["span_id"])


async def test_a_job_that_starts_at_once_is_one_trace_across_the_services(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = ClusterOptions(cluster="v100:1x1", quantum_s=1.0, data_dir=tmp_path / "gfair")
    async with EmbeddedCluster(options) as cluster:
        await run_jobs(cluster, {("alice", "once"): 3})
    # Stopped: every service has flushed its spans to the file.
    document = gfair_trace("alice/once", cluster.span_file, capsys)
    spans = document["spans"]
    assert {s["service"] for s in spans} >= {
        "placement",
        "split-stride",
        "node-executor",
        "failure-detector",
    }
    assert len({s["span_id"] for s in spans}) == len(spans)
    assert_causal(spans)
    names = [s["name"] for s in spans]
    for name in (
        "process gfair.job.submitted.v1",
        "publish gfair.job.placed.v1",
        "publish gfair.cmd.start.v1",
        "node_executor.run",
        "publish gfair.job.exited.v1",
        "publish gfair.job.completed.v1",
    ):
        assert name in names, f"{name} is not in the job's trace"
    (run,) = [s for s in spans if s["name"] == "node_executor.run"]
    assert run["attributes"]["gfair.run.end"] == "completed"
    assert run["attributes"]["gfair.job.id"] == "once"
    assert run["attributes"]["gfair.generation"] == "v100"
    # The run's reports are published under its span; its progress, one a second, without a
    # span each: what the profiler publishes of it hangs from the run directly.
    (exited,) = [s for s in spans if s["name"] == "publish gfair.job.exited.v1"]
    assert exited["parent_span_id"] == run["span_id"]
    assert "publish gfair.job.progress.v1" not in names
    profiles = [s for s in spans if s["name"] == "publish gfair.profile.updated.v1"]
    assert profiles and all(s["parent_span_id"] == run["span_id"] for s in profiles)


async def test_a_time_sliced_job_keeps_one_trace_through_suspends_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = ClusterOptions(cluster="v100:1x1", quantum_s=1.0, data_dir=tmp_path / "gfair")
    async with EmbeddedCluster(options) as cluster:
        # One GPU, two jobs of about three quanta each: they take turns.
        await run_jobs(cluster, {("alice", "turns-a"): 30, ("bob", "turns-b"): 30})
    for job in ("alice/turns-a", "bob/turns-b"):
        spans = gfair_trace(job, cluster.span_file, capsys)["spans"]
        assert_causal(spans)
        runs = [s for s in spans if s["name"] == "node_executor.run"]
        ends = sorted(r["attributes"]["gfair.run.end"] for r in runs)
        # Each quantum it ran is a run span in its trace: yielded ones, then the last one.
        assert len(runs) >= 2 and ends.count("completed") == 1, ends
        assert set(ends) == {"completed", "yielded"}, ends
        names = {s["name"] for s in spans}
        assert {"publish gfair.cmd.suspend.v1", "publish gfair.job.suspended.v1"} <= names
        assert "publish gfair.job.resumed.v1" in names or "publish gfair.job.started.v1" in names
