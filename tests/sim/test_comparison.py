"""Benchmark workloads and `gfair compare`: deterministic traces, sized clusters, one table."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from gfair.cli.main import main
from gfair.core.cluster import parse_cluster_spec
from gfair.core.throughput import ThroughputTable
from gfair.sim.comparison import Sources, compare, select
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import read_trace
from gfair.sim.workloads import (
    RATIOS,
    JobTypes,
    User,
    default_philly_trace_path,
    fit_to,
    gavel_trace,
    mean_speeds,
    middle,
    offered_load,
    philly_jobs,
    philly_virtual_clusters,
    size_cluster,
)

from .workloads import Row, trace_of


@pytest.fixture(scope="module")
def types(speeds: SpeedModel) -> JobTypes:
    return JobTypes.from_table(speeds)


def test_gavel_traces_are_deterministic_and_follow_gavels_distributions(types: JobTypes) -> None:
    trace = gavel_trace(2_000, 3.0, types, seed=7)
    assert trace == gavel_trace(2_000, 3.0, types, seed=7)
    assert trace != gavel_trace(2_000, 3.0, types, seed=8)
    sizes = Counter(job.gpus for job in trace.jobs)
    assert set(sizes) == {1, 2, 4, 8}
    assert sizes[1] / len(trace.jobs) == pytest.approx(0.7, abs=0.04)
    assert sizes[8] / len(trace.jobs) == pytest.approx(0.05, abs=0.02)
    minutes = [job.duration_s / 60 for job in trace.jobs]
    assert min(minutes) >= 10**1.5 and max(minutes) <= 10**4
    long = sum(m > 10**3 for m in minutes) / len(minutes)
    assert long == pytest.approx(0.2, abs=0.03)
    # Gangs only get types Gavel measured distributed; every type runs somewhere.
    assert all(job.job_type in types.distributed for job in trace.jobs if job.gpus > 1)
    assert {job.job_type for job in trace.jobs} <= set(types.single)
    assert set(types.distributed) < set(types.single)
    # Poisson arrivals at the rate asked for; every job its own user.
    hours = trace.jobs[-1].submit_s / 3600
    assert len(trace.jobs) / hours == pytest.approx(3.0, rel=0.1)
    assert len(trace.users) == len(trace.jobs)


def test_named_users_submit_in_proportion_and_keep_their_tickets(types: JobTypes) -> None:
    users = (User("big", 4.0, 3.0), User("small", 1.0, 1.0))
    trace = gavel_trace(800, 3.0, types, seed=1, users=users)
    counts = Counter(job.user for job in trace.jobs)
    assert counts["big"] / len(trace.jobs) == pytest.approx(0.75, abs=0.05)
    assert trace.tickets == {"big": 4.0, "small": 1.0}


def test_clusters_are_sized_for_the_load_in_the_ratio(types: JobTypes, speeds: SpeedModel) -> None:
    trace = gavel_trace(500, 3.0, types, seed=0)
    for name, ratio in RATIOS.items():
        for load in (0.8, 1.5):
            cluster = parse_cluster_spec(size_cluster(trace, speeds, ratio, load))
            assert set(cluster.gpus_per_generation()) == set(ratio), name
            means = mean_speeds(trace, speeds, cluster.generations)
            capacity = sum(n * means[g] for g, n in cluster.gpus_per_generation().items())
            # Whole 4-GPU servers: within a few percent of the load asked for.
            assert offered_load(trace) / capacity == pytest.approx(load, rel=0.1), (name, load)
    one = parse_cluster_spec(size_cluster(trace, speeds, RATIOS["12:128"], 1.0))
    pools = one.gpus_per_generation()
    assert pools["k80"] / pools["v100"] == pytest.approx(128 / 12, rel=0.15)


def test_fit_to_leaves_out_jobs_no_pool_can_hold() -> None:
    trace = trace_of([Row(0, "a", 4, 60), Row(1, "b", 8, 60), Row(2, "c", 16, 60)])
    fitted, dropped = fit_to(trace, parse_cluster_spec("v100:2x4,k80:1x4"))
    assert [job.gpus for job in fitted.jobs] == [4, 8]
    assert dropped == 1


def test_middle_takes_consecutive_jobs_around_the_median() -> None:
    trace = trace_of([Row(10.0 * n, f"u{n}", 1, 60) for n in range(10)])
    window = middle(trace, 4)
    assert [job.id for job in window.jobs] == ["3", "4", "5", "6"]
    assert window.jobs[0].submit_s == 0.0
    assert middle(trace, 20) is trace
    # 60 GPU-seconds each: a cap of 3 jobs' work keeps 3 jobs around the median.
    capped = middle(trace, 10, work_gpu_h=180 / 3600)
    assert [job.id for job in capped.jobs] == ["4", "5", "6"]
    # Submissions 10 s apart: 25 s of span holds 3 of them.
    spanned = middle(trace, 10, days=25 / 86_400)
    assert [job.id for job in spanned.jobs] == ["4", "5", "6"]


@pytest.mark.skipif(not default_philly_trace_path().is_file(), reason="no Philly trace")
def test_philly_virtual_clusters_become_typed_one_job_users(types: JobTypes) -> None:
    philly = read_trace(default_philly_trace_path())
    chosen = philly_virtual_clusters(philly, 300)
    assert len(chosen) == 11
    assert "0e4a51" in chosen
    trace = philly_jobs(philly, "0e4a51", types, seed=0)
    assert len(trace.jobs) == 1435
    assert trace.jobs[0].submit_s == 0.0
    assert len(trace.users) == len(trace.jobs)
    assert all(job.job_type in types.single for job in trace.jobs)
    assert philly_jobs(philly, "0e4a51", types, seed=0) == trace


def test_quick_workloads_replay_under_every_policy(throughput: ThroughputTable) -> None:
    sources = Sources(throughput, None, Path("absent.csv"))
    workloads = select(sources, ["quick-gavel/1:1:1"], quick=True)
    assert [w.name for w in workloads] == ["quick-gavel/1:1:1"]
    policies = ["gandiva-fair", "max-min-fairness", "tiresias", "fifo"]
    outcomes = compare(workloads, policies, throughput)
    assert [o.policy for o in outcomes] == policies
    for outcome in outcomes:
        assert outcome.completed == outcome.jobs == len(workloads[0].trace.jobs)
        assert len(outcome.jcts_s) == outcome.completed
        assert outcome.avg_jct_s is not None and outcome.avg_jct_s > 0
        assert outcome.jct_jain_index is not None and 0 < outcome.jct_jain_index <= 1
    # Work conservation as the issue words it: gandiva-fair leaves no GPU idle that a waiting
    # job fits; fifo, holding jobs behind the head of its queue, does.
    idle = {o.policy: o.idle_while_fitting for o in outcomes}
    assert idle["gandiva-fair"] == 0.0
    assert idle["fifo"] is not None and idle["fifo"] > 0.05
    # Two workers give the same rows (every replay is deterministic), wall times aside.
    again = compare(workloads, policies[:2], throughput, workers=2)
    for one, other in zip(outcomes[:2], again, strict=True):
        assert (one.avg_jct_s, one.makespan_s, one.jcts_s) == (
            other.avg_jct_s,
            other.makespan_s,
            other.jcts_s,
        )


def test_gfair_compare_quick_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot, rows = tmp_path / "cdf.png", tmp_path / "rows.json"
    code = main(
        [
            "compare", "--quick", "--workloads", "quick-users/*", "--workers", "1",
            "--plot", str(plot), "--json", str(rows),
        ]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "quick-users/1:1:1" in out
    for policy in ("gandiva-fair", "max-min-fairness", "tiresias", "fifo"):
        assert policy in out
    assert "4 replays" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    document = json.loads(rows.read_text())
    assert [row["policy"] for row in document["rows"]] == [
        "gandiva-fair",
        "max-min-fairness",
        "tiresias",
        "fifo",
    ]
    assert all(row["completed"] == row["jobs"] for row in document["rows"])


def test_gfair_compare_lists_and_refuses_unknown_workloads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["compare", "--quick", "--list"]) == 0
    assert "quick-gavel/12:128" in capsys.readouterr().out
    assert main(["compare", "--quick", "--workloads", "nothing-*"]) == 2
    assert "no workload matches" in capsys.readouterr().err
