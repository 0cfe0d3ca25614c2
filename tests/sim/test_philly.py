"""A sampled prefix of the packaged Philly trace, replayed as the full replay would be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gfair.core.cluster import parse_cluster_spec
from gfair.core.throughput import ThroughputTable
from gfair.sim.replay import ReplayOptions, replay
from gfair.sim.trace import read_trace

from .test_report import SCHEMA_PATH
from .test_trace import PHILLY_TRACE

# The ~2,000-GPU heterogeneous cluster of the full replay in docs/benchmarks.md.
CLUSTER = "v100:64x8,p100:64x8,k80:256x4"
PREFIX = 2_000


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["gandiva-fair", "fifo"])
def test_philly_prefix_replays_to_completion(policy: str, throughput: ThroughputTable) -> None:
    trace = read_trace(PHILLY_TRACE).head(PREFIX)
    outcome = replay(trace, parse_cluster_spec(CLUSTER), throughput, ReplayOptions(policy=policy))
    report: dict[str, Any] = json.loads(json.dumps(outcome.report.to_json()))
    jsonschema.validate(report, json.loads(Path(SCHEMA_PATH).read_text()))
    summary = report["summary"]
    assert summary["jobs"] == PREFIX
    assert summary["completed"] == PREFIX
    assert summary["rejected"] == 0
    # Every job's work got done, in V100-equivalent GPU-seconds.
    work = sum(job.gpus * job.duration_s for job in trace.jobs)
    done = sum(a.work_gpu_s for a in outcome.result.ledger.accounts.values())
    assert done == pytest.approx(work, rel=1e-9)
    assert report["timing"]["jobs_per_s"] > 0
