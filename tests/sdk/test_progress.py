from __future__ import annotations

from pathlib import Path

import pytest

from gfair.sdk.progress import ProgressLog, ProgressRecord


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_records_round_trip() -> None:
    records = [
        ProgressRecord(kind="ready", time=1.5, pid=42, handles_sigusr1=True),
        ProgressRecord(kind="step", time=2.0, step=3),
        ProgressRecord(
            kind="checkpoint", time=3.0, step=3, checkpoint_seq=1, checkpoint_path="/c/ckpt-1"
        ),
        ProgressRecord(kind="yield", time=4.0, step=3),
        ProgressRecord(kind="complete", time=5.0, step=9),
    ]
    assert [ProgressRecord.from_json(r.to_json()) for r in records] == records


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[1]", "not a JSON object"),
        ('{"kind": "explode", "time": 1}', "unknown kind"),
        ('{"kind": "step", "step": 1}', "numeric time"),
        ('{"kind": "step", "time": 1, "step": "3"}', "'step' must be an integer"),
        ("{not json", "Expecting property name"),
    ],
)
def test_malformed_records_are_rejected(line: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ProgressRecord.from_json(line)


def test_fast_step_records_are_buffered_but_slow_ones_flush(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    clock = FakeClock()
    log = ProgressLog(path, flush_interval_s=0.2, clock=clock)

    log.append(ProgressRecord(kind="step", time=0, step=1))  # first record: flushed
    clock.now += 0.05
    log.append(ProgressRecord(kind="step", time=0, step=2))  # 50 ms later: buffered
    assert len(lines(path)) == 1

    clock.now += 0.3
    log.append(ProgressRecord(kind="step", time=0, step=3))  # slow: flushes everything
    assert len(lines(path)) == 3
    log.close()


def test_lifecycle_records_flush_immediately(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    clock = FakeClock()
    log = ProgressLog(path, clock=clock)
    log.append(ProgressRecord(kind="step", time=0, step=1))
    log.append(ProgressRecord(kind="step", time=0, step=2))
    log.append(ProgressRecord(kind="checkpoint", time=0, step=2, checkpoint_seq=1))
    assert [ProgressRecord.from_json(x).kind for x in lines(path)] == [
        "step",
        "step",
        "checkpoint",
    ]
    log.close()


def test_without_a_path_nothing_is_written(tmp_path: Path) -> None:
    log = ProgressLog(None)
    log.append(ProgressRecord(kind="complete", time=0))
    log.flush()
    log.close()
    assert list(tmp_path.iterdir()) == []
