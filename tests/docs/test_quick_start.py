"""The README's quick start, run as written: the fenced block after `<!-- quick-start -->`.

Its first command (`gfair up`) runs in the background, as in a first terminal; each other one
runs in a fresh `bash` from a directory laid out as a checkout after `make` (its `.venv` is the
interpreter's own environment, `examples/` the repository's), with nothing activated: no
virtual environment on PATH, no `GFAIR_*` setting, a home of its own. A command must exit as
its comment says (`# exits 5: ...`), else 0, and leave its job as it says it does. Lines that
install something are not run; the commands that need what they install (torch) run when it is
importable already, else the test ends skipped with the reason once every other command passed.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from node.helpers import reachable_tmp
from support.waiting import eventually_sync

pytestmark = [pytest.mark.nats, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARKER = "<!-- quick-start -->"
VENV_BIN = Path(sys.executable).parent
tmp_path = pytest.fixture(name="tmp_path")(reachable_tmp)


@dataclass(frozen=True)
class Command:
    line: str  # as the README writes it, without its comment
    comment: str

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.line)

    @property
    def exit_code(self) -> int:
        said = re.search(r"\bexits (\d+)", self.comment)
        return int(said.group(1)) if said else 0

    @property
    def gfair(self) -> list[str] | None:
        """The arguments after `gfair`, when this runs gfair."""
        argv = self.argv
        return argv[1:] if argv and Path(argv[0]).name == "gfair" else None

    @property
    def installs(self) -> bool:
        return Path(self.argv[0]).name in ("pip", "pip3")

    @property
    def needs_torch(self) -> bool:
        return "pytorch_train.py" in self.line


def quick_start(text: str) -> list[Command]:
    """The commands of the fenced block that follows the marker."""
    _, marker, rest = text.partition(MARKER)
    assert marker, f"README.md has no {MARKER} block"
    block = re.match(r"\s*```(?:sh|bash|console)?\n(.*?)\n```", rest, re.DOTALL)
    assert block, f"no fenced block right after {MARKER}"
    commands = []
    for raw in block.group(1).splitlines():
        if raw.lstrip().startswith("#"):
            continue
        line, *comment = re.split(r"\s+#\s*", raw, maxsplit=1)
        if line.strip():
            commands.append(Command(line.strip(), "".join(comment).strip()))
    return commands


def test_the_quick_start_block_parses() -> None:
    commands = quick_start(README.read_text())
    assert commands[0].gfair is not None and commands[0].gfair[0] == "up"
    assert all(c.gfair is not None or c.installs for c in commands)
    # What the first hour needs: a job, watching it, asking why, its output, stopping it.
    used = {c.gfair[0] for c in commands if c.gfair}
    assert {"up", "submit", "jobs", "why", "logs", "cancel"} <= used
    assert any(c.needs_torch for c in commands)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A directory as the README's reader has it after `make`: `.venv` and `examples/`."""
    if not (VENV_BIN / "gfair").exists():
        pytest.skip(f"gfair is not installed beside {sys.executable} (run `make`)")
    here = tmp_path / "checkout"
    here.mkdir()
    (here / ".venv").symlink_to(VENV_BIN.parent)
    (here / "examples").symlink_to(ROOT / "examples")
    return here


@pytest.fixture
def shell_env(tmp_path: Path) -> dict[str, str]:
    """A fresh shell: nothing activated, no gfair settings, a home and state of its own."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("GFAIR_", "XDG_", "NATS_")) and name != "VIRTUAL_ENV"
    }
    path = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if Path(p) != VENV_BIN]
    env["PATH"] = os.pathsep.join(path)
    env["HOME"] = str(tmp_path / "home")
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env["COLUMNS"] = "160"
    if installed_from_here(env):
        # As after `make`: the jobs' `python` must find gfair by itself, not through this.
        env.pop("PYTHONPATH", None)
    return env


def installed_from_here(env: dict[str, str]) -> bool:
    """Whether the environment's Python imports this checkout's gfair with no PYTHONPATH."""
    probe = subprocess.run(
        [str(VENV_BIN / "python"), "-c", "import gfair; print(gfair.__file__)"],
        env={k: v for k, v in env.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
    )
    return probe.returncode == 0 and Path(probe.stdout.strip()).is_relative_to(ROOT)


@pytest.fixture
def cluster_up(checkout: Path, shell_env: dict[str, str], tmp_path: Path) -> Iterator[Path]:
    """The quick start's first command, in the background until the test ends."""
    up = quick_start(README.read_text())[0]
    log = tmp_path / "up.out"
    with log.open("w") as output:
        process = subprocess.Popen(
            ["bash", "-c", f"exec {up.line}"],
            cwd=checkout,
            env=shell_env,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        deadline = time.monotonic() + 120
        while "gfair cluster is up" not in log.read_text():
            assert process.poll() is None, f"`{up.line}` exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"`{up.line}` not up:\n{log.read_text()}"
            time.sleep(0.2)
        yield log
    finally:
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    assert code == 0, f"`{up.line}` stopped with {code}:\n{log.read_text()}"


def run(command: Command, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command.line], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


def job_of(command: Command) -> str | None:
    """USER/JOB a gfair command names: its argument, or a submission's --user and --job-id."""
    argv = command.gfair or []
    named = [a for a in argv[1:] if re.fullmatch(r"[\w.-]+/[\w.-]+", a)]
    if named:
        return named[0]
    if argv[:1] == ["submit"]:
        options = dict(itertools.pairwise(argv))
        return f"{options['--user']}/{options['--job-id']}"
    return None


def state(job: str, cwd: Path, env: dict[str, str]) -> str:
    shown = subprocess.run(
        [str(cwd / ".venv" / "bin" / "gfair"), "job", job, "--json"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    return str(json.loads(shown.stdout)["state"])


def settles(job: str, wanted: str, cwd: Path, env: dict[str, str], said: str) -> None:
    """Wait (a minute at most) for the job's state to be `wanted`; `said` is the command's."""
    reached = lambda: state(job, cwd, env) == wanted  # noqa: E731
    eventually_sync(reached, 60, 0.5, what=f"{job} {wanted} after {said}")


def torch_importable(cwd: Path, env: dict[str, str]) -> bool:
    python = cwd / ".venv" / "bin" / "python"
    return subprocess.run([str(python), "-c", "import torch"], env=env).returncode == 0


def test_the_quick_start_runs_as_written(
    cluster_up: Path, checkout: Path, shell_env: dict[str, str]
) -> None:
    commands = quick_start(README.read_text())[1:]
    has_torch = torch_importable(checkout, shell_env)
    left_out: list[str] = []
    jobs_left_out: set[str | None] = set()
    submitted: dict[str, Command] = {}
    for command in commands:
        if command.installs:
            continue  # the test installs nothing; CI installs torch beforehand (.ci/run)
        job = job_of(command)
        if (command.needs_torch and not has_torch) or job in jobs_left_out:
            left_out.append(command.line)  # needs torch, or reads a job that needed it
            jobs_left_out.add(job)
            continue
        done = run(command, checkout, shell_env)
        said = f"`{command.line}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        assert done.returncode == command.exit_code, said
        argv = command.gfair
        assert argv is not None
        if argv[0] == "submit":
            assert job is not None
            submitted[job] = command
            if "--wait=completed" in argv:
                assert state(job, checkout, shell_env) == "completed", said
            elif "--wait" in argv:
                assert state(job, checkout, shell_env) == "running", said
        elif argv[0] == "jobs":
            assert "running" in done.stdout, said
        elif argv[0] in ("why", "logs"):
            assert done.stdout.strip(), said
            if argv[0] == "logs" and job in submitted and "synthetic" in submitted[job].line:
                assert "synthetic" in done.stdout, said  # the job's own first line
        elif argv[0] == "cancel":
            assert job is not None
            settles(job, "cancelled", checkout, shell_env, said)
        elif argv[0] == "wait":
            assert job is not None
            expected = {0: "completed", 5: "cancelled"}[command.exit_code]
            assert state(job, checkout, shell_env) == expected, said
    if left_out:
        pytest.skip(
            "every other command of the quick start passed; not run (torch is not importable "
            f"by {checkout / '.venv/bin/python'}): " + "; ".join(left_out)
        )
