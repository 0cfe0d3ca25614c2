"""Finish-time fairness, makespan and queueing delay against hand computations.

FIFO on V100s with 60 s quanta and durations in whole quanta: every job's start and end are
known by hand, so N (the jobs present over a job's life) and both rhos are too. Jobs without a
type run at the V100's speed, so ideal_s is the trace's duration.
"""

from __future__ import annotations

import pytest

from gfair.core.cluster import parse_cluster_spec
from gfair.core.throughput import ThroughputTable
from gfair.sim.finish_time import GANG_AWARE, THEMIS, jobs_present
from gfair.sim.replay import ReplayOptions, replay
from gfair.sim.report import Report, jain_index

from .workloads import Row, trace_of

HOUR = 3600.0


def fifo(rows: list[Row], cluster: str, throughput: ThroughputTable) -> Report:
    options = ReplayOptions(policy="fifo", series_bucket_s=600.0)
    return replay(trace_of(rows), parse_cluster_spec(cluster), throughput, options).report


def rhos(report: Report, definition: str) -> list[float | None]:
    return [getattr(job, f"rho_{definition}") for job in report.jobs]


def test_two_jobs_on_one_gpu(throughput: ThroughputTable) -> None:
    # a runs [0, 1 h), b waits and runs [1 h, 2 h). a's life: 2 jobs throughout, N = 2;
    # b's: 2 jobs for 1 h, then itself for 1 h, N = 1.5. One GPU: both definitions agree.
    report = fifo([Row(0, "a", 1, HOUR), Row(0, "b", 1, HOUR)], "v100:1x1", throughput)
    assert [job.present for job in report.jobs] == pytest.approx([2.0, 1.5], abs=1e-9)
    expected = [HOUR / (HOUR * 2.0), 2 * HOUR / (HOUR * 1.5)]
    for definition in (THEMIS, GANG_AWARE):
        assert rhos(report, definition) == pytest.approx(expected, abs=1e-9)
        fairness = report.summary.finish_time_fairness[definition]
        assert fairness.worst == pytest.approx(4 / 3, abs=1e-9)
        assert fairness.mean == pytest.approx((0.5 + 4 / 3) / 2, abs=1e-9)
        assert fairness.over_1 == 0.5
        assert fairness.over_1_05 == 0.5
        jain = (0.5 + 4 / 3) ** 2 / (2 * (0.5**2 + (4 / 3) ** 2))
        assert fairness.jain == pytest.approx(jain, abs=1e-9)
    summary = report.summary
    assert summary.makespan_s == 2 * HOUR
    assert summary.avg_jct_s == 1.5 * HOUR
    assert summary.avg_queueing_s == HOUR / 2
    assert summary.p95_queueing_s == pytest.approx(0.95 * HOUR)


def test_a_gang_beside_single_gpu_jobs(throughput: ThroughputTable) -> None:
    # 4 GPUs. FIFO runs the 4-GPU gang first, [0, 1 h); the two 1-GPU jobs wait, then run
    # [1 h, 2 h). Gang: 3 jobs present, N = 3; singles: 3 for 1 h, 2 for 1 h, N = 2.5.
    rows = [Row(0, "gang", 4, HOUR), Row(0, "s1", 1, HOUR), Row(0, "s2", 1, HOUR)]
    report = fifo(rows, "v100:1x4", throughput)
    assert [job.present for job in report.jobs] == pytest.approx([3.0, 2.5, 2.5], abs=1e-9)
    # Themis: JCT / (T x N), whatever the GPU count.
    themis = [HOUR / (HOUR * 3), 2 * HOUR / (HOUR * 2.5), 2 * HOUR / (HOUR * 2.5)]
    assert rhos(report, THEMIS) == pytest.approx(themis, abs=1e-9)
    # Gang-aware: JCT / (T x max(1, N g / C)). The gang's share of 4/3 GPUs runs its 4 GPUs a
    # third of the time (T x 3); a single's 1.6 GPUs hold its 1 GPU all the time (T x 1).
    gang = [HOUR / (HOUR * 3 * 4 / 4), 2 * HOUR / HOUR, 2 * HOUR / HOUR]
    assert rhos(report, GANG_AWARE) == pytest.approx(gang, abs=1e-9)
    fairness = report.summary.finish_time_fairness
    assert fairness[THEMIS].over_1 == 0.0
    assert fairness[GANG_AWARE].over_1 == pytest.approx(2 / 3)
    assert fairness[GANG_AWARE].worst == pytest.approx(2.0, abs=1e-9)
    assert fairness[THEMIS].jain == pytest.approx(jain_index(themis), abs=1e-9)
    assert fairness[GANG_AWARE].jain == pytest.approx(jain_index(gang), abs=1e-9)


def test_a_job_alone_has_rho_one(throughput: ThroughputTable) -> None:
    report = fifo([Row(120, "solo", 2, 2 * HOUR)], "v100:1x4", throughput)
    job = report.jobs[0]
    assert job.present == 1.0
    assert job.rho_themis == pytest.approx(1.0, abs=1e-9)
    assert job.rho_gang_aware == pytest.approx(1.0, abs=1e-9)
    for definition in (THEMIS, GANG_AWARE):
        fairness = report.summary.finish_time_fairness[definition]
        assert (fairness.worst, fairness.over_1, fairness.over_1_05) == (1.0, 0.0, 0.0)
        assert fairness.jain == pytest.approx(1.0)
    assert report.summary.makespan_s == 2 * HOUR
    assert report.summary.avg_queueing_s == 0.0


def test_shares_over_time_hold_received_against_entitled(throughput: ThroughputTable) -> None:
    # Two users on one GPU, each entitled to half while both are active; a holds it first.
    report = fifo([Row(0, "a", 1, HOUR), Row(0, "b", 1, HOUR)], "v100:1x1", throughput)
    shares = report.shares_over_time
    assert shares is not None
    first_hour = int(HOUR // shares.bucket_s)
    assert shares.received["a"][:first_hour] == pytest.approx([1.0] * first_hour)
    assert shares.received["b"][:first_hour] == pytest.approx([0.0] * first_hour)
    assert shares.entitled["a"][:first_hour] == pytest.approx([0.5] * first_hour)
    assert shares.entitled["b"][first_hour : 2 * first_hour] == pytest.approx([1.0] * first_hour)


def test_jobs_present_integrates_overlaps_exactly() -> None:
    spans = [(0.0, 10.0), (5.0, 15.0), (10.0, 10.0), (20.0, 30.0)]
    assert jobs_present(spans) == [1.5, 1.5, None, 1.0]
