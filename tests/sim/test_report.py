from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gfair.core.cluster import parse_cluster_spec
from gfair.core.throughput import ThroughputTable
from gfair.sim.replay import POLICY_NAMES, ReplayOptions, replay
from gfair.sim.report import cluster_spec, jain_index, percentile

from .workloads import Row, backlog, trace_of

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "report.schema.json"


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(loaded)
    return loaded


def report_json(policy: str, throughput: ThroughputTable, **options: Any) -> dict[str, Any]:
    trace = trace_of(
        [
            Row(0, "ann", 1, 900, "ResNet-50 (batch size 32)", "2"),
            Row(0, "ann", 4, 600, "ResNet-50 (batch size 32)"),
            Row(10, "bob", 2, 1200, "Recommendation (batch size 8192)"),
            Row(20, "bob", 1, 300),
            Row(30, "cat", 8, 200),
        ]
    )
    cluster = parse_cluster_spec("v100:1x8,k80:2x4")
    outcome = replay(trace, cluster, throughput, ReplayOptions(policy=policy, **options))
    # Through text, as a consumer of the file would see it.
    loaded: dict[str, Any] = json.loads(json.dumps(outcome.report.to_json()))
    return loaded


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_reports_validate_against_the_published_schema(
    policy: str, throughput: ThroughputTable, schema: dict[str, Any]
) -> None:
    report = report_json(policy, throughput)
    jsonschema.validate(report, schema)
    assert report["policy"] == policy
    assert report["cluster"] == {
        "spec": "v100:1x8,k80:2x4",
        "servers": 3,
        "gpus": 16,
        "generations": {"k80": 8, "v100": 8},
    }
    assert set(report["users"]) == {"ann", "bob", "cat"}
    assert report["users"]["ann"]["tickets"] == 2.0
    assert len(report["jobs"]) == 5


def test_an_unfinished_run_validates_too(
    throughput: ThroughputTable, schema: dict[str, Any]
) -> None:
    report = report_json("gandiva-fair", throughput, until_s=120.0)
    jsonschema.validate(report, schema)
    statuses = {job["status"] for job in report["jobs"]}
    assert "unfinished" in statuses
    unfinished = [job for job in report["jobs"] if job["status"] == "unfinished"]
    assert all(job["end_s"] is None and job["jct_s"] is None for job in unfinished)


def test_the_schema_rejects_a_report_missing_a_metric(
    throughput: ThroughputTable, schema: dict[str, Any]
) -> None:
    report = report_json("fifo", throughput)
    del report["summary"]["jain_index"]
    with pytest.raises(jsonschema.ValidationError, match="jain_index"):
        jsonschema.validate(report, schema)


def test_summary_metrics_follow_the_jobs(throughput: ThroughputTable) -> None:
    report = report_json("fifo", throughput)
    jcts = sorted(job["jct_s"] for job in report["jobs"])
    summary = report["summary"]
    assert summary["avg_jct_s"] == pytest.approx(sum(jcts) / len(jcts))
    assert summary["p50_jct_s"] == pytest.approx(jcts[2])
    assert summary["completed"] == 5
    assert 0 < summary["utilization"] <= 1
    for job in report["jobs"]:
        assert job["jct_s"] == pytest.approx(job["end_s"] - job["submit_s"])
    assert report["timing"]["jobs_per_s"] > 0


def test_busy_while_waiting_and_jct_fairness_by_hand(throughput: ThroughputTable) -> None:
    # FIFO on 8 GPUs, 60 s quanta: A (4 GPUs, 600 s) runs; B (8 GPUs, arrives at 10 s) and C
    # (1 GPU, 20 s) are first left waiting by the decision at 60 s. Then 4 GPUs are busy until
    # 600, when B starts and C still waits, B's 8 until 660; then nobody waits (C runs alone).
    # Busy while waiting: (4 x 540 + 8 x 60) / (8 x 600).
    trace = trace_of([Row(0, "u", 4, 600), Row(10, "u", 8, 60), Row(20, "u", 1, 60)])
    outcome = replay(
        trace, parse_cluster_spec("v100:1x8"), throughput, ReplayOptions(policy="fifo")
    )
    summary = outcome.report.summary
    assert summary.busy_while_waiting == pytest.approx((4 * 540 + 8 * 60) / (8 * 600))
    # FIFO keeps C behind B: one of the 4 idle GPUs could have run C from 60 to 600 s.
    assert summary.idle_while_fitting == pytest.approx(1 * 540 / (8 * 600))
    assert summary.jct_jain_index == pytest.approx(jain_index([600 / 600, 60 / 650, 60 / 700]))
    # Nobody ever waits: no value rather than a perfect one.
    alone = replay(
        trace_of([Row(0, "u", 1, 60)]),
        parse_cluster_spec("v100:1x8"),
        throughput,
        ReplayOptions(policy="fifo"),
    )
    assert alone.report.summary.busy_while_waiting is None
    assert alone.report.summary.idle_while_fitting is None
    assert alone.report.summary.jct_jain_index == pytest.approx(1.0)


def test_trading_gain_compares_against_the_run_without_trading(
    throughput: ThroughputTable,
) -> None:
    types = {"fast": "ResNet-50 (batch size 32)", "slow": "Recommendation (batch size 8192)"}
    trace = backlog(["fast", "slow"], 12, job_types=types)
    cluster = parse_cluster_spec("v100:1x8,k80:2x4")
    options = ReplayOptions(until_s=3 * 3600)
    traded = replay(trace, cluster, throughput, options)
    assert traded.report.summary.trades > 0
    assert traded.report.summary.trading_gain > 0.05
    untraded = replay(trace, cluster, throughput, ReplayOptions(until_s=3 * 3600, trading=False))
    assert untraded.report.summary.trades == 0
    assert untraded.report.summary.trading_gain == 0.0


def test_percentiles_interpolate_linearly() -> None:
    assert percentile([], 0.5) is None
    assert percentile([5.0], 0.99) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([10.0, 0.0, 20.0], 0.95) == pytest.approx(19.0)


def test_jain_index_is_one_when_equal_and_one_over_n_when_one_takes_all() -> None:
    assert jain_index([0.7, 0.7, 0.7]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain_index([]) is None


def test_cluster_spec_round_trips() -> None:
    spec = "v100:4x8,p100:2x8,k80:8x4,v100:1x4"
    assert cluster_spec(parse_cluster_spec(spec)) == spec
