"""`gfair replay`: the golden journals of tests/data/journals replay with every output the same,
a changed output is found and named, and `gfair simulate --journal` records one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gfair.cli.main import main

JOURNALS = Path(__file__).parents[1] / "data" / "journals"
GOLDEN = sorted(JOURNALS.glob("*.jsonl"))


def test_there_are_golden_journals_each_small() -> None:
    assert len(GOLDEN) >= 3
    assert all(path.stat().st_size < 1_000_000 for path in GOLDEN)


@pytest.mark.parametrize("journal", GOLDEN, ids=lambda path: path.stem)
def test_a_golden_journal_replays_with_every_output_the_same(
    journal: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(journal)]) == 0
    assert "every output matched" in capsys.readouterr().out


def test_a_changed_output_is_reported_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = (JOURNALS / "time_limit.jsonl").read_text().splitlines()
    # The last tick's plan: say it was of another quantum.
    number = max(i for i, line in enumerate(lines) if '"@":"Tick"' in line)
    entry = json.loads(lines[number])
    entry["out"]["quantum"] += 1
    lines[number] = json.dumps(entry)
    changed = tmp_path / "changed.jsonl"
    changed.write_text("\n".join(lines) + "\n")
    assert main(["replay", str(changed)]) == 1
    err = capsys.readouterr().err
    assert f"line {number + 1}: the output of Tick differs at .quantum" in err


def test_simulate_records_a_journal_that_replays(tmp_path: Path) -> None:
    journal = tmp_path / "run.jsonl"
    trace = JOURNALS / "gang.csv"
    args = ["simulate", "--trace", str(trace), "--cluster", "v100:1x4", "--quantum", "60"]
    assert main([*args, "--journal", str(journal)]) == 0
    header = json.loads(journal.read_text().splitlines()[0])
    assert header["journal"] == 1 and header["config"]["quantum_s"] == 60
    assert main(["replay", str(journal)]) == 0
    assert main([*args, "--policy", "fifo", "--journal", str(journal)]) == 2
