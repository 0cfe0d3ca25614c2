"""Gandiva_fair's guarantees, measured on backlogged workloads through the simulator.

Shares are measured over [warm-up, end] in whole 10-minute buckets of the share series; every
user has far more work queued than the experiment lasts, so everyone stays active throughout.
"""

from __future__ import annotations

import pytest

from gfair.core.cluster import parse_cluster_spec
from gfair.core.throughput import ThroughputTable
from gfair.sim.ledger import WindowTotals
from gfair.sim.replay import ReplayOptions, replay
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import Trace

from .workloads import backlog

WARM_UP_S = 3_600.0
END_S = 6 * 3_600.0
BUCKET_S = 600.0

# Gavel 1-GPU job types whose V100/K80 speedups are the closest to the paper's 6x, 4x, 2x and
# 1.2x (the table has nothing between 1.05x and 1.65x, so the low gainer is at 1.05x).
GAINERS = {
    "u6x": "ResNet-50 (batch size 32)",  # 6.30x
    "u4x": "LM (batch size 40)",  # 3.93x
    "u2x": "A3C",  # 2.09x
    "u1x": "Recommendation (batch size 8192)",  # 1.05x
}

# The paper's heterogeneous cluster, 12 V100s, 24 P100s and 128 K80s in 4-GPU servers, and four
# users of Gavel job types whose V100-over-K80 speedups span 1x to 10x (GAINERS with the 6x user
# replaced by a 10x one). P100-over-K80 in brackets: the 1x user's model runs twice as fast on a
# P100 as on a V100 or a K80, so the P100 is the pool it values most.
PAPER_CLUSTER = "v100:3x4,p100:6x4,k80:32x4"
PAPER_USERS = {
    "u10x": "ResNet-18 (batch size 128)",  # 9.96x (6.46x)
    "u4x": "LM (batch size 40)",  # 3.93x (3.11x)
    "u2x": "A3C",  # 2.09x (1.65x)
    "u1x": "Recommendation (batch size 8192)",  # 1.05x (2.06x)
}


def shares(
    trace: Trace, spec: str, throughput: ThroughputTable, **options: object
) -> dict[str, WindowTotals]:
    cluster = parse_cluster_spec(spec)
    outcome = replay(
        trace,
        cluster,
        throughput,
        ReplayOptions(until_s=END_S, series_bucket_s=BUCKET_S, **options),  # type: ignore[arg-type]
    )
    assert outcome.series is not None
    assert all(job.status == "unfinished" for job in outcome.result.jobs)
    return outcome.series.window(WARM_UP_S, END_S)


def test_four_backlogged_users_get_a_quarter_each(throughput: ThroughputTable) -> None:
    # Mixed gang sizes, so gang-aware stride and load balancing both matter.
    trace = backlog(["a", "b", "c", "d"], 24, sizes=(1, 2, 4, 1))
    measured = shares(trace, "v100:4x8", throughput)
    for user, totals in measured.items():
        assert totals.entitled_share == pytest.approx(0.25)
        assert totals.received_share == pytest.approx(0.25, abs=0.02), user


def test_tickets_four_to_one_split_eighty_twenty(throughput: ThroughputTable) -> None:
    trace = backlog(["rich", "poor"], 40, sizes=(1, 2, 1), tickets={"rich": 4, "poor": 1})
    measured = shares(trace, "v100:4x8", throughput)
    assert measured["rich"].received_share == pytest.approx(0.80, abs=0.02)
    assert measured["poor"].received_share == pytest.approx(0.20, abs=0.02)


def test_the_chosen_job_types_have_the_papers_speedups(speeds: SpeedModel) -> None:
    speedups = {u: 1 / speeds.speed(t, "k80") for u, t in GAINERS.items()}
    assert speedups["u6x"] == pytest.approx(6.0, abs=0.5)
    assert speedups["u4x"] == pytest.approx(4.0, abs=0.5)
    assert speedups["u2x"] == pytest.approx(2.0, abs=0.5)
    assert speedups["u1x"] == pytest.approx(1.2, abs=0.25)


@pytest.fixture(scope="module")
def trading_runs(throughput: ThroughputTable) -> tuple[dict[str, float], dict[str, float]]:
    """Each user's effective throughput with and without trading, V100 + K80 cluster.

    The paper's V100 and K80 counts (12 and 128): the ratio matters, because a buyer pays for
    fast share with its slow share (quantity = buyer's K80 share / price). On a 1:1 cluster the
    top gainer's whole K80 share buys only 1/3.93 of as many V100s and it gains about 8%.
    48 jobs per user keep all four backlogged (192 GPUs asked of 140).
    """
    trace = backlog(list(GAINERS), 48, job_types=GAINERS)
    spec = "v100:3x4,k80:32x4"
    traded = shares(trace, spec, throughput, trading=True)
    untraded = shares(trace, spec, throughput, trading=False)
    return (
        {user: totals.throughput for user, totals in traded.items()},
        {user: totals.throughput for user, totals in untraded.items()},
    )


def test_trading_leaves_nobody_worse_off_and_raises_the_total(
    trading_runs: tuple[dict[str, float], dict[str, float]],
) -> None:
    traded, untraded = trading_runs
    for user in GAINERS:
        assert traded[user] >= untraded[user] * 0.99, user
    assert sum(traded.values()) > 1.1 * sum(untraded.values())
    # Both ends of the auction gain: the top bidder buys V100 share, the bottom one sells it.
    assert traded["u6x"] > 1.05 * untraded["u6x"]
    assert traded["u1x"] > 1.2 * untraded["u1x"]


def test_paper_result_highest_and_lowest_gainers_gain_about_30_percent(
    trading_runs: tuple[dict[str, float], dict[str, float]],
) -> None:
    """The highest (6x) and lowest (1.05x) gainers each gain about 30%; nobody loses.

    The paper reports the two middle users unaffected. Here the 3.93x user is (within 1%), while
    the 2.09x user also gains (about +18%) from the later pairs of the repeated auction
    (docs/design.md §2.5 trades until no pair gains).
    """
    traded, untraded = trading_runs
    gain = {user: traded[user] / untraded[user] - 1 for user in GAINERS}
    assert gain["u6x"] == pytest.approx(0.30, abs=0.10)
    assert gain["u1x"] == pytest.approx(0.30, abs=0.10)
    assert min(gain["u6x"], gain["u1x"]) >= 0.25, gain
    assert all(value >= -0.01 for value in gain.values()), gain


def test_the_paper_cluster_users_span_one_to_ten_times(speeds: SpeedModel) -> None:
    speedups = {u: 1 / speeds.speed(t, "k80") for u, t in PAPER_USERS.items()}
    assert speedups["u10x"] == pytest.approx(10.0, abs=0.5)
    assert speedups["u4x"] == pytest.approx(4.0, abs=0.5)
    assert speedups["u2x"] == pytest.approx(2.0, abs=0.5)
    assert speedups["u1x"] == pytest.approx(1.0, abs=0.25)


def test_trading_on_the_papers_cluster_raises_both_ends_by_a_quarter(
    throughput: ThroughputTable,
) -> None:
    """Three pools, jobs of 1, 2 and 4 GPUs: the highest (10x) and lowest (1x) gainers each gain
    at least 25% (the paper: about 30%), and nobody loses.

    The lowest user sells its V100 and its P100 share to the highest at each pair's second price
    (docs/design.md §2.5); when the K80-V100 auction ran first for every seller, the 10x user
    spent all its K80 share on V100s and the 1x user's P100 share went to the 4x user at the 10%
    floor over its own bid: +17% to it.
    """
    trace = backlog(list(PAPER_USERS), 48, sizes=(1, 2, 4), job_types=PAPER_USERS)
    traded = shares(trace, PAPER_CLUSTER, throughput, trading=True)
    untraded = shares(trace, PAPER_CLUSTER, throughput, trading=False)
    gain = {u: traded[u].throughput / untraded[u].throughput - 1 for u in PAPER_USERS}
    assert gain["u10x"] >= 0.25, gain
    assert gain["u1x"] >= 0.25, gain
    assert all(value >= -0.01 for value in gain.values()), gain
    assert sum(t.throughput for t in traded.values()) > 1.1 * sum(
        t.throughput for t in untraded.values()
    )
