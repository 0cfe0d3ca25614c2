from __future__ import annotations

import pytest

from gfair.sim.ledger import Ledger, ShareSeries


def test_series_splits_intervals_across_buckets() -> None:
    series = ShareSeries(capacity=4, start=0.0, bucket_s=10.0, max_buckets=100)
    series.add(series.gpu_s, "a", 5.0, 25.0, 2.0)  # 2 GPUs for 20 s
    assert series.gpu_s["a"] == pytest.approx([10.0, 20.0, 10.0])
    assert series.shares("a", series.gpu_s) == pytest.approx([0.25, 0.5, 0.25])
    assert series.times() == [0.0, 10.0, 20.0]


def test_series_merges_buckets_instead_of_growing_without_bound() -> None:
    series = ShareSeries(capacity=1, start=0.0, bucket_s=1.0, max_buckets=4)
    series.add(series.gpu_s, "a", 0.0, 3.0, 1.0)
    series.add(series.gpu_s, "b", 3.0, 9.5, 1.0)
    assert series.bucket_s == 4.0
    assert len(series.times()) == 3
    assert series.gpu_s["a"] == pytest.approx([3.0, 0.0, 0.0])
    assert series.gpu_s["b"] == pytest.approx([1.0, 4.0, 1.5])
    assert sum(series.gpu_s["b"]) == pytest.approx(6.5)


def test_window_totals_cover_whole_buckets_only() -> None:
    series = ShareSeries(capacity=2, start=0.0, bucket_s=10.0, max_buckets=100)
    series.add(series.gpu_s, "a", 0.0, 40.0, 1.0)
    series.add(series.work_gpu_s, "a", 0.0, 40.0, 0.5)
    series.add(series.entitled_gpu_s, "a", 0.0, 40.0, 1.0)
    window = series.window(5.0, 40.0)  # buckets [10, 40)
    assert window["a"].received_share == pytest.approx(0.5)
    assert window["a"].entitled_share == pytest.approx(0.5)
    assert window["a"].throughput == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no whole bucket"):
        series.window(12.0, 18.0)


def test_ledger_integrates_entitlement_only_while_active() -> None:
    ledger = Ledger(capacity=8, tickets={"a": 3.0}, default_tickets=1.0)
    ledger.admit(0.0, "a", 8)
    ledger.admit(10.0, "b", 8)
    ledger.depart(30.0, "b", 8)
    ledger.depart(40.0, "a", 8)
    ledger.close(100.0)
    a, b = ledger.accounts["a"], ledger.accounts["b"]
    assert (a.active_s, b.active_s) == (40.0, 20.0)
    assert a.entitled_gpu_s == pytest.approx(8 * 10 + 6 * 20 + 8 * 10)
    assert b.entitled_gpu_s == pytest.approx(2 * 20)
    assert (a.jobs, a.tickets, b.tickets) == (1, 3.0, 1.0)
