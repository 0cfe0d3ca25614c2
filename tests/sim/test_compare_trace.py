"""`gfair compare --trace` on a user's own trace, and `gfair trace convert`."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gfair.cli.main import main
from gfair.gavel import load_scaled_throughputs
from gfair.sim.trace import read_trace, write_trace

from .workloads import Row, trace_of

HOUR = 3600


def test_compare_on_a_trace_writes_the_same_rows_as_json_and_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "two.csv"
    trace.write_text(
        f"submit_time_s,user,gpus,duration_s\n0,a,1,{HOUR}\n0,b,1,{HOUR}\n", encoding="utf-8"
    )
    rows, table, plot = tmp_path / "rows.json", tmp_path / "rows.csv", tmp_path / "fig.png"
    code = main(
        [
            "compare", "--trace", str(trace), "--cluster", "v100:1x1", "--quantum", "60",
            "--policies", "fifo", "tiresias", "--workers", "1",
            "--json", str(rows), "--csv", str(table), "--plot", str(plot),
        ]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "two: v100:1x1" in out and "2 replays" in out
    by_policy = {row["policy"]: row for row in csv.DictReader(table.open(encoding="utf-8"))}
    assert list(by_policy) == ["fifo", "tiresias"]
    fifo = by_policy["fifo"]
    # a runs [0, 1 h) with 2 jobs present; b [1 h, 2 h) with 1.5 on average (see
    # test_finish_time): rho 0.5 and 4/3 under both definitions on one GPU.
    assert float(fifo["makespan_s"]) == 2 * HOUR
    assert float(fifo["avg_queueing_s"]) == HOUR / 2
    for definition in ("themis", "gang_aware"):
        assert float(fifo[f"rho_{definition}_worst"]) == pytest.approx(4 / 3, abs=1e-9)
        assert float(fifo[f"rho_{definition}_mean"]) == pytest.approx((0.5 + 4 / 3) / 2)
        assert float(fifo[f"rho_{definition}_over_1"]) == 0.5
    document = json.loads(rows.read_text(encoding="utf-8"))
    first = document["rows"][0]
    assert first["finish_time_fairness"]["themis"]["worst"] == pytest.approx(4 / 3)
    assert set(first["shares_over_time"]["received"]) == {"a", "b"}
    assert first["shares_over_time"]["entitled"]["a"][0] == pytest.approx(0.5)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_trace_needs_a_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--trace", "any.csv"]) == 2
    assert "--trace needs --cluster" in capsys.readouterr().err
    assert main(["compare", "--cluster", "v100:1x1"]) == 2
    assert "go with --trace" in capsys.readouterr().err


def test_write_trace_reads_back_as_the_same_jobs(tmp_path: Path) -> None:
    trace = trace_of(
        [Row(0, "ann", 4, 900.25, "ResNet-50 (batch size 32)", "2"), Row(1.5, "bob", 1, 60)]
    )
    path = tmp_path / "out.csv"
    with path.open("w", encoding="utf-8", newline="") as stream:
        write_trace(trace, stream)
    again = read_trace(path)
    fields = [(j.id, j.user, j.gpus, j.submit_s, j.duration_s, j.job_type) for j in trace.jobs]
    assert [(j.id, j.user, j.gpus, j.submit_s, j.duration_s, j.job_type) for j in again.jobs] == (
        fields
    )
    assert again.tickets == {"ann": 2.0}


def test_convert_a_gavel_trace(tmp_path: Path) -> None:
    gavel = tmp_path / "workload.trace"
    lines = [
        ("ResNet-50 (batch size 32)", 1000, 1, 1, 0),
        ("ResNet-50 (batch size 32)", 5000, 4, 2, 120.5),
    ]
    gavel.write_text(
        "".join(
            f"{kind}\tpython3 main.py\timage_classification\t--num_steps\t1\t{steps}\t{gpus}"
            f"\t{weight}\t-1\t{arrival}\n"
            for kind, steps, gpus, weight, arrival in lines
        ),
        encoding="utf-8",
    )
    out = tmp_path / "gavel.csv"
    assert main(["trace", "convert", "--from", "gavel", str(gavel), "-o", str(out)]) == 0
    trace = read_trace(out)
    rates = load_scaled_throughputs()
    kind = "ResNet-50 (batch size 32)"
    assert [(j.user, j.gpus, j.submit_s, j.job_type) for j in trace.jobs] == [
        ("job-0", 1, 0.0, kind),
        ("job-1", 4, 120.5, kind),
    ]
    assert trace.jobs[0].duration_s == pytest.approx(1000 / rates[(kind, 1)]["v100"])
    assert trace.jobs[1].duration_s == pytest.approx(5000 / rates[(kind, 4)]["v100"])
    assert trace.tickets == {"job-0": 1.0, "job-1": 2.0}


def test_convert_a_philly_trace_and_refuse_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    philly = tmp_path / "philly.csv"
    philly.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:05:00,300,8,2400,vc2\n"
        "2017-10-09 07:01:55,60,1,60,vc1\n",
        encoding="utf-8",
    )
    out = tmp_path / "gfair.csv"
    assert main(["trace", "convert", "--from", "philly", str(philly), "-o", str(out)]) == 0
    trace = read_trace(out)
    assert trace.format == "gfair"
    assert [(j.user, j.gpus, j.submit_s, j.duration_s) for j in trace.jobs] == [
        ("vc1", 1, 0.0, 60.0),
        ("vc2", 8, 185.0, 300.0),
    ]
    assert main(["trace", "convert", "--from", "gavel", str(philly)]) == 2
    assert "expected 10 tab-separated fields" in capsys.readouterr().err
    assert main(["trace", "convert", "--from", "philly", str(out)]) == 2
    assert "not a Philly trace" in capsys.readouterr().err
