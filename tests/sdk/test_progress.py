from __future__ import annotations

from pathlib import Path

import pytest

from gfair.sdk.progress import ProgressLog, ProgressRecord
from support.clock import FakeClock


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


def test_mini_batches_are_sampled_and_each_run_of_them_recorded_at_both_ends(
    tmp_path: Path,
) -> None:
    path = tmp_path / "progress.jsonl"
    clock = FakeClock()
    log = ProgressLog(path, step_interval_s=0.2, clock=clock.seconds)

    def written() -> list[tuple[str, int | None, float]]:
        return [(r.kind, r.step, r.time) for r in map(ProgressRecord.from_json, lines(path))]

    log.append(ProgressRecord(kind="ready", time=0.0))
    log.step(1, 1.0)  # the first after the start: at once (it times the start)
    clock.advance(0.05)
    log.step(2, 2.0)  # 50 ms later: kept
    log.step(3, 3.0)
    assert written() == [("ready", None, 0.0), ("step", 1, 1.0)]

    clock.advance(0.3)
    log.step(4, 4.0)  # one is due: the newest goes
    assert written()[-1] == ("step", 4, 4.0)
    clock.advance(0.01)
    log.step(5, 5.0)
    # Any other record writes the newest mini-batch first, with its own time.
    log.append(ProgressRecord(kind="parked", time=6.0, step=5, park=1))
    assert written()[-2:] == [("step", 5, 5.0), ("parked", 5, 6.0)]

    log.append(ProgressRecord(kind="resumed", time=7.0, step=5, park=1))
    log.step(6, 8.0)  # the first after a resume: at once (it times the resume)
    assert written()[-1] == ("step", 6, 8.0)
    log.step(7, 9.0)
    log.close()  # and the last one at the end
    assert written()[-1] == ("step", 7, 9.0)


def test_without_a_path_nothing_is_written(tmp_path: Path) -> None:
    log = ProgressLog(None)
    log.append(ProgressRecord(kind="complete", time=0))
    log.flush()
    log.close()
    assert list(tmp_path.iterdir()) == []
