from __future__ import annotations

from pathlib import Path

import pytest

from gfair.node.progress import ProgressTail, RateWindow
from gfair.sdk.progress import ProgressRecord


def step(t: float, n: int) -> str:
    return ProgressRecord(kind="step", time=t, step=n).to_json() + "\n"


def test_tail_reads_only_new_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    tail = ProgressTail(path)
    assert tail.read() == []  # the job has not started writing yet

    with path.open("a") as fh:
        fh.write(step(1.0, 1) + step(2.0, 2))
        fh.write(step(3.0, 3)[:10])  # half a line: the job is mid-write
    assert [r.step for r in tail.read()] == [1, 2]

    with path.open("a") as fh:
        fh.write(step(3.0, 3)[10:])
    assert [r.step for r in tail.read()] == [3]
    assert tail.read() == []
    tail.close()


def test_tail_skips_and_counts_garbage(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    path.write_bytes(
        b"not json\n\xff\xfe\n" + step(1.0, 5).encode() + b'{"kind":"nope","time":1}\n'
    )
    tail = ProgressTail(path)
    assert [r.step for r in tail.read()] == [5]
    assert tail.malformed == 3
    assert tail.last_error is not None and "unknown kind" in tail.last_error


def test_rate_window_measures_over_its_width() -> None:
    window = RateWindow(2.0)
    assert window.rate() is None
    window.add(0.0, 0)
    assert window.rate() is None
    for i in range(1, 11):  # 10 steps/s for one second
        window.add(i * 0.1, i)
    assert window.rate() == pytest.approx(10.0)
    for i in range(1, 91):  # then 30 steps/s for three seconds: the old rate leaves the window
        window.add(1.0 + i / 30, 10 + i)
    assert window.rate() == pytest.approx(30.0)


def test_rate_window_rejects_a_non_positive_width() -> None:
    with pytest.raises(ValueError, match="window_s"):
        RateWindow(0)
