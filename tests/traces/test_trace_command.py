"""`gfair trace JOB`: JSON and tree output from a span file, and which span file it reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gfair.cli.main import main
from gfair.cli.trace import default_span_file

from .synthetic import BOBS, T1, T1_ORDER, T2, write_span_file


@pytest.fixture(autouse=True)
def no_configured_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GFAIR_SPAN_FILE", "GFAIR_JAEGER_URL", "GFAIR_USER"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def span_file(tmp_path: Path) -> Path:
    return write_span_file(tmp_path / "spans.jsonl")


def test_json_is_the_job_trace_in_causal_order(
    span_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", "alice/j1", "--span-file", str(span_file), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["trace_id"] == T1 and document["other_trace_ids"] == [T2]
    assert tuple(s["span_id"] for s in document["spans"]) == T1_ORDER
    seen: set[str] = set()
    for item in document["spans"]:  # every parent in the trace comes before its children
        parent = item["parent_span_id"]
        assert parent in seen or parent not in {s["span_id"] for s in document["spans"]}
        seen.add(item["span_id"])


def test_the_tree_shows_services_spans_and_key_attributes(
    span_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["trace", "j1", "--user", "alice", "--span-file", str(span_file)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"alice/j1  trace {T1}  5 spans, 3 services")
    placed = next(line for line in lines if "publish gfair.job.placed.v1" in line)
    assert "placement" in placed and "servers=v100-0" in placed and "generation=v100" in placed
    assert "2.0ms @+10.0ms" in placed  # duration, then offset from the trace's first span
    handled = next(line for line in lines if "split-stride process gfair.job.placed.v1" in line)
    # Drawn one level below the publish it handles.
    assert handled.index("split-stride") > placed.index("placement")
    assert "1 other trace(s) also mention this job" in out


def test_unknown_and_ambiguous_jobs_fail_with_a_reason(
    span_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", "j1", "--span-file", str(span_file)]) == 1
    assert "several users (alice, bob); pass --user" in capsys.readouterr().err
    assert main(["trace", "bob/nope", "--span-file", str(span_file)]) == 1
    assert "no span mentions bob's job 'nope'" in capsys.readouterr().err
    assert main(["trace", "bob/j1", "--user", "alice", "--span-file", str(span_file)]) == 1
    assert "belongs to 'bob'" in capsys.readouterr().err


def test_the_default_span_file_is_the_configured_one_else_the_newest_under_dot_gfair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert default_span_file() is None
    assert main(["trace", "alice/j1"]) == 1
    assert "no span file" in capsys.readouterr().err
    old = write_span_file(tmp_path / ".gfair" / "demo-1" / "traces" / "spans.jsonl")
    write_span_file(tmp_path / ".gfair" / "traces" / "spans.jsonl", (BOBS,))
    os.utime(old, (1_000, 1_000))
    assert default_span_file() == tmp_path / ".gfair" / "traces" / "spans.jsonl"
    assert main(["trace", "j1", "--json"]) == 0  # only bob's j1 in the newest file
    assert json.loads(capsys.readouterr().out)["user"] == "bob"
    monkeypatch.setenv("GFAIR_SPAN_FILE", str(old))
    assert default_span_file() == old
    assert main(["trace", "alice/j1", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["spans"]) == len(T1_ORDER)
