"""`gfair demo` runs to its summary: a whole cluster, the workload, and a clean stop."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.nats
def test_a_short_demo_runs_to_its_summary(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    # A process of its own: the demo configures logging and signal handlers for its process.
    argv = ["demo", "--duration", "20", "--quantum", "1", "--data-dir", str(data)]
    done = subprocess.run(
        [sys.executable, "-m", "gfair.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    # Not a terminal: periodic plain lines, then the summary.
    # The first line's second depends on how fast the cluster came up on a loaded machine.
    assert re.search(r"^\[ *\d+s\] ", out, re.MULTILINE), out
    assert "summary per user" in out
    busy = int(out.split("GPUs busy: ")[1].split("%")[0])
    assert 0 < busy <= 100
    for user in ("vision", "nlp", "rl", "recsys"):
        assert user in out
    assert "scheduler actions: started" in out
    started = int(out.split("scheduler actions: started ")[1].split(",")[0])
    assert started > 0
    assert f"logs:   {data / 'logs'}" in out
    assert (data / "traces" / "spans.jsonl").stat().st_size > 0
    assert (data / "logs" / "placement.log").exists()
