"""`gfair.state.usage`: history lines, windows and decayed usage from job records."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gfair.events.jobs import JobCompleted
from gfair.events.states import JobState
from gfair.state.job_record import JobRecord
from gfair.state.usage import account, format_duration, parse_duration, selected, usage

from .test_job_accounting import JOB, T0, at, fold, placed, started, submitted, suspended

HOUR = 3600.0
NOW = T0 + timedelta(hours=10)


def finished(user: str, gpus: int, start_h: float, end_h: float) -> JobRecord:
    """A job of `user` that ran on v100 from hour `start_h` to `end_h` (after T0) and completed."""
    record = fold(submitted(gpus), 0, placed("v100", "v100-0"))
    record = fold(record, start_h * HOUR, started("v100-0"))
    record = fold(record, end_h * HOUR, JobCompleted(user="alice", job_id=JOB, attempt=1))
    return record.model_copy(update={"user": user})


def running(user: str, gpus: int, start_h: float) -> JobRecord:
    record = fold(
        fold(submitted(gpus), 0, placed("v100", "v100-0")), start_h * HOUR, started("v100-0")
    )
    return record.model_copy(update={"user": user})


def decayed_numerically(gpus: int, start_h: float, end_h: float, half_life_h: float) -> float:
    """GPU-hours weighted by 2^-(age / half-life), summed in one-second steps."""
    steps = round((end_h - start_h) * HOUR)
    now_h = (NOW - T0).total_seconds() / HOUR
    return sum(
        gpus * 2 ** (-(now_h - (start_h + (i + 0.5) / HOUR)) / half_life_h) / HOUR
        for i in range(steps)
    )


def test_history_lines_carry_wait_runtime_and_gpu_hours() -> None:
    line = account(finished("alice", 2, start_h=1, end_h=4), NOW)
    assert line.wait_s == HOUR and line.runtime_s(NOW) == 3 * HOUR
    assert line.gpu_hours == {"v100": pytest.approx(6.0)}
    assert line.state is JobState.COMPLETED and line.ended_at == at(4 * HOUR)
    queued = account(submitted(1), NOW)
    assert queued.wait_s is None and queued.runtime_s(NOW) is None and queued.gpu_hours == {}


def test_windows_and_decay() -> None:
    alice = finished("alice", 2, start_h=7, end_h=9)  # 4 GPU-hours, ended an hour ago
    bob = running("bob", 1, start_h=9.5)  # running for the last half hour
    lines = usage([alice, bob], NOW, windows_s=(HOUR, 2 * HOUR, 86_400.0), half_life_s=HOUR)
    a, b = lines
    assert (a.user, b.user) == ("alice", "bob")
    assert a.windows == pytest.approx({HOUR: 0.0, 2 * HOUR: 2.0, 86_400.0: 4.0})
    assert b.windows == pytest.approx({HOUR: 0.5, 2 * HOUR: 0.5, 86_400.0: 0.5})
    assert (a.jobs, a.running, b.running) == (1, 0, 1)
    assert a.decayed_gpu_hours == pytest.approx(decayed_numerically(2, 7, 9, 1.0), rel=1e-6)
    assert b.decayed_gpu_hours == pytest.approx(decayed_numerically(1, 9.5, 10, 1.0), rel=1e-6)
    assert a.decayed_share + b.decayed_share == pytest.approx(1.0)
    # A longer half-life forgets less: alice's older usage weighs more against bob's.
    slow = usage([alice, bob], NOW, windows_s=(), half_life_s=100 * HOUR)
    assert slow[0].decayed_share > a.decayed_share
    assert slow[0].decayed_gpu_hours == pytest.approx(4.0 * 2 ** (-2 / 100), rel=1e-3)


def test_a_suspended_job_spreads_its_time_up_to_its_last_change() -> None:
    record = fold(fold(submitted(1), 0, placed("v100", "v100-0")), HOUR, started("v100-0"))
    record = fold(record, 3 * HOUR, suspended("v100-0"))
    (line,) = usage([record], NOW, windows_s=(8 * HOUR,), half_life_s=HOUR)
    assert line.gpu_hours == pytest.approx({"v100": 2.0})
    assert line.windows[8 * HOUR] == pytest.approx(1.0)  # from hour 2 on: half of [1h, 3h]


def test_selection_by_user_state_and_time() -> None:
    early = finished("alice", 1, start_h=0.5, end_h=1)
    late = running("bob", 1, start_h=5)
    records = [late, early]
    assert selected(records) == [early, late]  # by submission, then user
    assert selected(records, users=["bob"]) == [late]
    assert selected(records, states=[JobState.COMPLETED]) == [early]
    assert selected(records, since=at(2 * HOUR)) == [late]  # alice's ended before
    assert selected(records, until=T0 - timedelta(seconds=1)) == []


def test_durations() -> None:
    assert [parse_duration(t) for t in ("90", "90s", "15m", "2h", "7d", "1w")] == [
        90,
        90,
        900,
        7200,
        604_800,
        604_800,
    ]
    for bad in ("", "h", "-1h", "0", "soon", "inf"):
        with pytest.raises(ValueError, match="duration"):
            parse_duration(bad)
    assert [format_duration(s) for s in (45, 900, 7200, 86_400, 1_209_600, 90.5)] == [
        "45s",
        "15m",
        "2h",
        "1d",
        "2w",
        "90.5s",
    ]
    assert parse_duration("1.5h") == 5400
