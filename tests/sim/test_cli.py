from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import jsonschema
import pytest

import gfair.sim
from gfair.cli.main import main

from .test_report import SCHEMA_PATH

TRACE = """submit_time_s,user,gpus,duration_s,job_type,tickets
0,ann,1,900,ResNet-50 (batch size 32),3
0,ann,2,600,ResNet-50 (batch size 32),
5,bob,1,1200,Recommendation (batch size 8192),1
20,bob,4,300,,
700,cat,1,60,,
"""


def write_trace(tmp_path: Path, text: str = TRACE) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_simulate_writes_report_timeline_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report, timeline, plot = tmp_path / "r.json", tmp_path / "t.jsonl", tmp_path / "s.png"
    code = main(
        [
            "simulate",
            "--trace", str(write_trace(tmp_path)),
            "--cluster", "v100:1x4,k80:2x4",
            "--quantum", "30",
            "--tickets", "cat=2", "bob=2",
            "--report", str(report),
            "--timeline", str(timeline),
            "--plot", str(plot),
        ]
    )  # fmt: skip
    assert code == 0
    data = json.loads(report.read_text())
    jsonschema.validate(data, json.loads(SCHEMA_PATH.read_text()))
    assert data["policy"] == "gandiva-fair"
    assert data["quantum_s"] == 30.0
    assert {u: v["tickets"] for u, v in data["users"].items()} == {"ann": 3, "bob": 2, "cat": 2}
    assert data["summary"]["completed"] == 5
    lines = timeline.read_text().splitlines()
    assert lines and all(json.loads(line)["running"] for line in lines)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "gandiva-fair on v100:1x4,k80:2x4" in out
    assert "5/5 completed, 0 rejected" in out


@pytest.mark.parametrize("policy", ["fifo", "static-partition", "tiresias"])
def test_simulate_runs_the_baselines(
    tmp_path: Path, policy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "r.json"
    args = ["simulate", "--trace", str(write_trace(tmp_path)), "--cluster", "v100:2x4"]
    assert main([*args, "--policy", policy, "--report", str(report)]) == 0
    assert json.loads(report.read_text())["policy"] == policy
    assert f"{policy} on v100:2x4" in capsys.readouterr().out


def test_no_trading_reports_zero_gain(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    args = ["simulate", "--trace", str(write_trace(tmp_path)), "--cluster", "v100:1x4,k80:1x4"]
    assert main([*args, "--no-trading", "--report", str(report)]) == 0
    summary = json.loads(report.read_text())["summary"]
    assert summary["trades"] == 0 and summary["trading_gain"] == 0.0


@pytest.mark.parametrize(
    ("extra", "trace", "message"),
    [
        ([], TRACE.replace("20,bob,4", "20,bob,four"), "trace.csv:5: column 'gpus'"),
        (["--tickets", "bob"], TRACE, "--tickets 'bob': expected USER=N"),
        (["--tickets", "bob=-1"], TRACE, "--tickets 'bob=-1'"),
        ([], TRACE.replace(",,", ",Tetris,"), "unknown job type 'Tetris'"),
    ],
)
def test_bad_input_exits_2_with_a_precise_message(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    trace: str,
    message: str,
) -> None:
    args = ["simulate", "--trace", str(write_trace(tmp_path, trace)), "--cluster", "v100:1x4"]
    assert main([*args, *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_bad_cluster_spec_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--trace", str(write_trace(tmp_path)), "--cluster", "v100:4"]
    assert main(args) == 2
    assert "cluster spec item 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "name", "message"),
    [
        ("--report", "missing/r.json", "no directory"),
        ("--timeline", ".", "is a directory"),
        ("--plot", "shares.bmpx", "unknown image format .bmpx"),
        ("--plot", "t.jsonl", "also given to --timeline"),
    ],
)
def test_output_paths_are_checked_before_the_run(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    flag: str,
    name: str,
    message: str,
) -> None:
    def replay(*_: object, **__: object) -> None:
        raise AssertionError("the replay ran with an output it could not write")

    monkeypatch.setattr("gfair.cli.simulate.replay", replay)
    monkeypatch.chdir(tmp_path)
    args = ["simulate", "--trace", str(write_trace(tmp_path)), "--cluster", "v100:1x4"]
    outputs = ["--timeline", "t.jsonl", flag, name] if flag != "--timeline" else [flag, name]
    assert main([*args, *outputs]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "t.jsonl").exists() or flag == "--timeline"


def test_an_unwritable_output_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    args = ["simulate", "--trace", str(write_trace(tmp_path)), "--cluster", "v100:1x4"]
    assert main([*args, "--report", str(folder / "r.json")]) == 2
    assert "not writable" in capsys.readouterr().err


def test_without_matplotlib_only_plot_needs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """matplotlib is the `plot` extra: a replay runs without it; --plot says what to install
    before the replay starts."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    for name in [m for m in sys.modules if m.startswith("matplotlib.") or m == "gfair.sim.plot"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delattr(gfair.sim, "plot", raising=False)  # the package's handle on it too
    args = ["simulate", "--trace", str(write_trace(tmp_path)), "--cluster", "v100:1x4"]
    report = tmp_path / "r.json"
    assert main([*args, "--report", str(report)]) == 0
    assert json.loads(report.read_text())["summary"]["completed"] == 5
    capsys.readouterr()
    assert main([*args, "--plot", str(tmp_path / "s.png")]) == 2
    assert "pip install 'gfair[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "s.png").exists()
