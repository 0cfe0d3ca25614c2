from __future__ import annotations

from pathlib import Path

import pytest

from gfair.node.progress import ProgressLimits, ProgressTail, RateWindow
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


def test_tail_skips_a_line_whose_time_overflows_a_float(tmp_path: Path) -> None:
    # Issue 41: an integer of 400 digits made float() raise OverflowError out of the reader.
    path = tmp_path / "progress.jsonl"
    path.write_text('{"kind":"step","time":1' + "0" * 400 + ',"step":1}\n' + step(1.0, 2))
    tail = ProgressTail(path)
    assert [r.step for r in tail.read()] == [2]
    assert tail.malformed == 1


def test_one_read_of_a_flood_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    with path.open("w") as fh:
        for n in range(200_000):  # about 6 MB: far past the backlog kept
            fh.write(step(float(n), n))
            if n % 2:
                fh.write('{"kind":"ready","time":1}\n')  # breaks runs of steps
    limits = ProgressLimits(read_bytes=8192, records_per_s=10, backlog_bytes=65536)
    tail = ProgressTail(path, limits=limits, clock=lambda: 0.0)
    first = tail.read()
    # Never the whole backlog: a chunk, from the newest part of the file, at most the rate.
    assert len(first) == 10
    assert tail._file is not None and tail._file.tell() == path.stat().st_size
    assert tail.skipped_bytes == path.stat().st_size - 8192
    assert tail.dropped > 0
    assert tail.read() == []  # the rate's second is spent, and nothing new came


def test_a_run_of_steps_is_read_as_its_first_and_last(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    path.write_text("".join(step(float(n), n) for n in range(1, 101)))
    assert [r.step for r in ProgressTail(path).read()] == [1, 100]


def test_an_endless_line_is_skipped_in_bounded_reads(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    limits = ProgressLimits(read_bytes=1024, max_line_bytes=2048)
    tail = ProgressTail(path, limits=limits)
    with path.open("a") as fh:
        fh.write('{"kind":"step","time":1,"pad":"' + "x" * 10_000)
    for _ in range(20):
        assert tail.read() == []
    assert len(tail._partial) <= limits.max_line_bytes
    with path.open("a") as fh:
        fh.write('"}\n' + step(2.0, 7))
    assert [r.step for r in tail.read()] == [7]
    assert tail.malformed == 1
