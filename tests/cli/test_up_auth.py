"""`gfair up --auth tenants.toml`, then the tools with the logins it prints: a tenant submits,
the operator sees the job through, a tool without a login is turned away."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gfair.cluster_logins import LOGINS_FILE
from node.helpers import JOB_PYTHON, LIBS, reachable_tmp
from support.waiting import eventually_sync

GFAIR = [sys.executable, "-m", "gfair.cli.main"]
# As root, jobs run as their tenants' own uids: a Python, a SDK and directories they reach.
JOB = ["--", JOB_PYTHON, "-m", "gfair.sdk.synthetic", "--iterations", "20"]
TENANTS = "[[tenants]]\nname = 'alice'\n\n[[tenants]]\nname = 'bob'\n"
EXPORT = re.compile(r"^export (.*)$", re.MULTILINE)


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


def gfair(*argv: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GFAIR, *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def logins_printed(output: str) -> dict[str, dict[str, str]]:
    """Each printed `export` line as its variables, by GFAIR_NATS_USER."""
    found: dict[str, dict[str, str]] = {}
    for line in EXPORT.findall(output):
        variables = dict(item.split("=", 1) for item in line.split())
        found[variables["GFAIR_NATS_USER"]] = variables
    return found


def test_a_bad_tenants_file_is_refused_before_anything_starts(
    tmp_path: Path, environment: dict[str, str]
) -> None:
    (tmp_path / "bad.toml").write_text("[[tenants]]\nname = 'a.b'\n")
    refused = gfair("up", "--auth", "bad.toml", env=environment, cwd=tmp_path)
    assert refused.returncode == 2
    assert "bad.toml: tenants[0].name" in refused.stderr
    missing = gfair("up", "--auth", "none.toml", env=environment, cwd=tmp_path)
    assert missing.returncode == 2 and "none.toml: cannot read" in missing.stderr
    assert not (tmp_path / ".gfair").exists()


@pytest.mark.nats
@pytest.mark.slow
def test_the_printed_logins_let_a_tenant_submit_and_the_operator_follow(
    tmp_path: Path, environment: dict[str, str]
) -> None:
    tenants_file = tmp_path / "tenants.toml"
    tenants_file.write_text(TENANTS)
    where = tmp_path / "up"
    where.mkdir()
    with (tmp_path / "up.out").open("w") as output:
        up = subprocess.Popen(
            [*GFAIR, "up", "--cluster", "v100:1x2", "--quantum", "1", "--auth", str(tenants_file)],
            cwd=where,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        deadline = time.monotonic() + 120
        while "Ctrl-C stops the cluster" not in (tmp_path / "up.out").read_text():
            if up.poll() is not None:
                pytest.fail(f"gfair up exited with {up.returncode}:\n{_read(tmp_path)}")
            assert time.monotonic() < deadline, "gfair up not ready within 120 s"
            time.sleep(0.2)
        # The rest of the summary.
        eventually_sync(
            lambda: set(logins_printed(_read(tmp_path))) == {"operator", "alice", "bob"}, 20
        )
        printed = logins_printed(_read(tmp_path))

        logins = where / ".gfair" / "auth" / LOGINS_FILE
        assert stat.S_IMODE(logins.stat().st_mode) == 0o600
        assert logins_printed(logins.read_text()) == printed
        assert tenants_file.read_text() == TENANTS

        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        alice = environment | printed["alice"]
        submitted = gfair(
            "submit", "--gpus", "1", "--no-wait", "--json", *JOB, env=alice, cwd=elsewhere
        )
        assert submitted.returncode == 0, submitted.stderr
        job = json.loads(submitted.stdout)
        assert job["user"] == "alice"  # GFAIR_USER came with her login

        operator = environment | printed["operator"]
        waited = gfair(
            "wait", f"alice/{job['job_id']}", "--timeout", "90", env=operator, cwd=elsewhere
        )
        assert waited.returncode == 0, waited.stdout + waited.stderr

        # Every reading command works with a tenant's login, about her own jobs only.
        bob = environment | printed["bob"]
        theirs = gfair("submit", "--gpus", "1", "--wait", "completed", *JOB, env=bob, cwd=elsewhere)
        assert theirs.returncode == 0, theirs.stdout + theirs.stderr
        listed = gfair("jobs", "--json", env=alice, cwd=elsewhere)
        assert listed.returncode == 0, listed.stderr
        assert [(j["user"], j["job_id"]) for j in json.loads(listed.stdout)] == [
            ("alice", job["job_id"])
        ]
        reference = f"alice/{job['job_id']}"
        for argv in (
            ("wait", reference),
            ("job", reference),
            ("why", reference),
            ("logs", reference),
            ("users",),
            ("nodes",),
            ("history",),
            ("usage",),
            ("top", "--once"),
        ):
            read = gfair(*argv, env=alice, cwd=elsewhere)
            assert read.returncode == 0, (argv, read.stdout + read.stderr)
            assert "bob" not in read.stdout, (argv, read.stdout)
        assert "synthetic" in gfair("logs", reference, env=alice, cwd=elsewhere).stdout
        foreign = gfair("jobs", "--user", "bob", env=alice, cwd=elsewhere)
        assert foreign.returncode != 0 and "only alice's jobs" in foreign.stderr, foreign.stderr
        # An operator's command is refused by the client, not left to a publish that times out.
        uncordon = gfair("nodes", "uncordon", "sim-1", env=alice, cwd=elsewhere)
        assert uncordon.returncode != 0 and "operator's command" in uncordon.stderr, uncordon

        # Found through the context file, but not let in without a login.
        stranger = gfair("jobs", "--json", env=environment, cwd=elsewhere)
        assert stranger.returncode == 3, stranger.stdout + stranger.stderr
        assert "refused the login (no login)" in stranger.stderr, stranger.stderr
        wrong = environment | printed["operator"] | {"GFAIR_NATS_PASSWORD": "Wrong0password"}
        mistyped = gfair("jobs", "--json", env=wrong, cwd=elsewhere)
        assert mistyped.returncode == 3
        assert "refused the login (user 'operator')" in mistyped.stderr, mistyped.stderr

        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0
        assert not logins.exists(), "the stopped cluster's passwords are void; not kept"
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()


def _read(tmp_path: Path) -> str:
    return (tmp_path / "up.out").read_text()
