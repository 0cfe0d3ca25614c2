"""`gfair up` in one terminal, `gfair submit` and `gfair jobs` in another, nothing exported:
the tools find the cluster through the context file `up` writes, and lose it when `up` stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gfair.client.cluster_context import read_context
from node.helpers import JOB_PYTHON, LIBS, reachable_tmp

pytestmark = [pytest.mark.nats, pytest.mark.slow]

GFAIR = [sys.executable, "-m", "gfair.cli.main"]
# As root, jobs run as their tenants' own uids: a Python, a SDK and directories they reach.
JOB = ["--", JOB_PYTHON, "-m", "gfair.sdk.synthetic", "--iterations", "100000"]


@pytest.fixture
def environment(tmp_path: Path) -> dict[str, str]:
    """A user with a fresh home and state dir and no NATS settings of any kind."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GFAIR_", "XDG_"))}
    env["HOME"] = str(tmp_path / "home")
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env["COLUMNS"] = "200"
    env["PYTHONPATH"] = str(LIBS)
    return env


tmp_path = pytest.fixture(name="tmp_path")(reachable_tmp)


@pytest.fixture
def up(tmp_path: Path, environment: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    where = tmp_path / "up"
    where.mkdir()
    # A file, not a pipe nobody reads while the test runs.
    with (tmp_path / "up.out").open("w") as output:
        process = subprocess.Popen(
            [*GFAIR, "up", "--cluster", "v100:1x2", "--quantum", "1"],
            cwd=where,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def gfair(*argv: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GFAIR, *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_tools_find_a_running_up_without_being_told(
    up: subprocess.Popen[str], environment: dict[str, str], tmp_path: Path
) -> None:
    user_context = tmp_path / "state" / "gfair" / "clusters" / f"{up.pid}.json"
    local_context = tmp_path / "up" / ".gfair" / "context.json"
    deadline = time.monotonic() + 120
    while not user_context.exists():
        if up.poll() is not None:
            output = (tmp_path / "up.out").read_text()
            pytest.fail(f"gfair up exited with {up.returncode}:\n{output}")
        assert time.monotonic() < deadline, "gfair up not ready within 120 s"
        time.sleep(0.2)
    context = read_context(user_context)
    assert context is not None and context.pid == up.pid and context.running
    assert read_context(local_context) == context

    # Another terminal, another directory: only the per-user context can tell it where to go.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    submitted = gfair(
        "submit", "--user", "alice", "--gpus", "1", "--wait", "--json", *JOB,
        env=environment, cwd=elsewhere,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)
    assert job["state"] == "running"

    listed = gfair("jobs", "--user", "alice", "--json", env=environment, cwd=elsewhere)
    assert listed.returncode == 0, listed.stderr
    assert [record["job_id"] for record in json.loads(listed.stdout)] == [job["job_id"]]
    # The directory `up` runs in finds it through <data-dir>/context.json as well.
    shown = gfair("job", f"alice/{job['job_id']}", "--json", env=environment, cwd=tmp_path / "up")
    assert shown.returncode == 0, shown.stderr

    # A second `up` on the same data dir would share the broker's store: refused.
    second = gfair("up", "--cluster", "v100:1x1", env=environment, cwd=tmp_path / "up")
    assert second.returncode == 1 and "already runs" in second.stderr

    printed = (tmp_path / "up.out").read_text()
    assert str(user_context) in printed and context.nats_url in printed

    up.send_signal(signal.SIGINT)
    assert up.wait(60) == 0
    assert not user_context.exists() and not local_context.exists()
