"""The demo's measurements: received share over a sliding window, and the plain report line."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console

from gfair.cli.demo_dashboard import (
    DashboardFrame,
    ShareWindow,
    Tally,
    plain_line,
    pools_of,
    trades_text,
    users_table,
)
from gfair.cli.demo_workload import JOBS, USERS, tickets_setting
from gfair.events.jobs import JobStarted, JobSuspended
from gfair.events.reasons import SuspendReason
from gfair.state.share_record import PoolShare, SharesRecord, UserShare
from gfair.state.stride_record import ServerRecord, StrideRecord


def test_received_share_is_the_usage_rate_over_the_window() -> None:
    window = ShareWindow(window_s=10.0)
    window.add(0.0, {"alice": {"v100": 0.0}})
    assert window.received() == {}
    window.add(5.0, {"alice": {"v100": 10.0}})  # 2 GPUs for 5 s
    assert window.received()["alice"]["v100"] == pytest.approx(2.0)
    window.add(10.0, {"alice": {"v100": 30.0}, "bob": {"k80": 4.0}})  # then 4 GPUs
    assert window.received()["alice"]["v100"] == pytest.approx(3.0)
    assert window.received()["bob"]["k80"] == pytest.approx(0.4)
    # Older samples slide out: from t=10 to t=20 alice held 1 GPU.
    window.add(15.0, {"alice": {"v100": 35.0}})
    window.add(20.0, {"alice": {"v100": 40.0}})
    assert window.received()["alice"]["v100"] == pytest.approx(1.0)


def test_plain_line_reports_entitled_against_received() -> None:
    shares = SharesRecord(
        revision=3,
        computed_at=datetime.now(UTC),
        min_seller_gain=0.1,
        capacity={"k80": 4, "v100": 4},
        users={
            "alice": UserShare(
                user="alice",
                tickets=1,
                jobs=2,
                demand=2,
                pools={
                    "k80": PoolShare(fair=1, entitled=0.5),
                    "v100": PoolShare(fair=1, entitled=1.5),
                },
                throughput_fair=1,
                throughput_entitled=1.2,
            )
        },
    )
    snapshot = DashboardFrame(
        elapsed_s=42,
        duration_s=120,
        shares=shares,
        stride=None,
        jobs=[],
        received={"alice": {"v100": 1.25, "k80": 0.5}},
        tally=Tally(),
        speedups={"alice": "6x"},
    )
    line = plain_line(snapshot)
    assert line.startswith("[  42s]")
    assert "alice ent 2.0 rcv 1.8" in line


def test_the_workload_contends_and_names_every_user_once() -> None:
    assert {job.user for job in JOBS} == {user.name for user in USERS}
    assert sum(job.gpus for job in JOBS) > 16  # more than the demo cluster's GPUs
    assert len({job.name for job in JOBS}) == len(JOBS)
    assert tickets_setting() == "vision=1,nlp=2,rl=1,recsys=2"


def test_a_suspend_that_moves_a_job_counts_as_a_migration() -> None:
    tally = Tally()
    for reason in (SuspendReason.TIME_SLICE, SuspendReason.MIGRATION, SuspendReason.MIGRATION):
        tally.count(
            JobSuspended(user="alice", job_id="j", node_id="k80-0", attempt=1, reason=reason)
        )
    tally.count(JobStarted(user="alice", job_id="j", node_id="v100-0", gpu_indices=(0,), attempt=1))
    assert (tally.events["suspended"], tally.events["migrated"], tally.events["started"]) == (
        1,
        2,
        1,
    )


def _stride(tick_s: float | None, usage: dict[str, dict[str, float]], *pools: str) -> StrideRecord:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return StrideRecord(
        epoch="e",
        usage=usage,
        usage_since=start,
        last_tick_at=start + timedelta(seconds=tick_s) if tick_s is not None else None,
        updated_at=start,
        servers={
            f"{pool}-0": ServerRecord(
                node_id=f"{pool}-0", generation=pool, gpu_indices=(0, 1), changed_at=start
            )
            for pool in pools
        },
    )


def test_received_is_measured_between_split_strides_ticks_and_states_that_span() -> None:
    # A user held to 2 GPUs; split-stride charges them a 60 s quantum at a time.
    window = ShareWindow(window_s=60.0)
    window.add_record(_stride(None, {}))
    assert window.received() == {} and window.span_s() == 0.0
    window.add_record(_stride(60.0, {"alice": {"v100": 120.0}}))
    assert window.received()["alice"]["v100"] == pytest.approx(2.0)
    assert window.span_s() == pytest.approx(60.0)
    # Read again seconds later, the same tick: nothing new, the same 2 GPUs over the same span
    # (a reader's clock would have divided the next quantum's charge by those seconds).
    window.add_record(_stride(60.0, {"alice": {"v100": 120.0}}))
    window.add_record(_stride(120.0, {"alice": {"v100": 240.0}}))
    assert window.received()["alice"]["v100"] == pytest.approx(2.0)
    assert window.span_s() == pytest.approx(60.0)


def _snapshot(
    shares: SharesRecord | None, stride: StrideRecord | None, tally: Tally
) -> DashboardFrame:
    return DashboardFrame(
        elapsed_s=1,
        duration_s=10,
        shares=shares,
        stride=stride,
        jobs=[],
        received={},
        tally=tally,
        speedups={},
    )


def test_pool_columns_keep_one_order_whichever_record_names_them() -> None:
    stride = _stride(1.0, {}, "k80", "p100", "v100")
    shares = SharesRecord(
        revision=1,
        computed_at=datetime.now(UTC),
        min_seller_gain=0.1,
        capacity={"k80": 2, "p100": 2, "v100": 2},
    )
    before = pools_of(_snapshot(None, stride, Tally()))
    after = pools_of(_snapshot(shares, stride, Tally()))
    assert before == after == ["v100", "p100", "k80"]


def test_no_trade_in_force_says_whether_some_cleared_earlier() -> None:
    assert str(trades_text(_snapshot(None, None, Tally()))) == "trades in force: none yet"
    text = str(trades_text(_snapshot(None, None, Tally(trades=13))))
    assert "none yet" not in text and "13 cleared earlier" in text


def test_top_names_each_users_account_only_with_a_shares_file() -> None:
    share = UserShare(
        user="alice",
        tickets=1,
        jobs=1,
        demand=1,
        pools={"v100": PoolShare(fair=1, entitled=1)},
        throughput_fair=1,
        throughput_entitled=1,
    )
    flat = SharesRecord(
        revision=1,
        computed_at=datetime.now(UTC),
        min_seller_gain=0.1,
        capacity={"v100": 4},
        users={"alice": share},
    )
    placed = flat.model_copy(update={"members": {"alice": "lab/vision"}})

    def text(shares: SharesRecord) -> str:
        snapshot = _snapshot(shares, None, Tally())
        snapshot = replace(snapshot, speedups={"alice": "-"})
        console = Console(width=200, record=True, force_terminal=False)
        console.print(users_table(snapshot))
        return console.export_text()

    assert "account" in text(placed) and "lab/vision" in text(placed)
    assert "account" not in text(flat)
