"""The wheel stands on its own: built, installed in a bare virtual environment, it runs.

A checkout hides what the wheel forgets (the editable install reads files straight from the
source tree), so this builds the wheel, installs it with its dependencies into a fresh virtual
environment without system site-packages, and runs it from an empty folder with the repository
off `sys.path`. Nothing in that environment can reach the checkout's data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

# Replays the first 30 jobs of two weeks of the packaged Philly trace on 24 GPUs, in seconds.
SHORT_REPLAY = (
    "--cluster", "v100:2x8,k80:2x4", "--jobs", "30", "--quantum", "300", "--until", "1209600",
)  # fmt: skip


@dataclass(frozen=True)
class Install:
    wheel: Path
    venv: Path
    workdir: Path

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args,
            cwd=self.workdir,
            env=_bare_environment(self.venv),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def gfair(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.venv / "bin" / "gfair"), *args)


def _bare_environment(venv: Path) -> dict[str, str]:
    # Dropped: what would let the installed gfair see the checkout or another configuration (a
    # PYTHONPATH, the developer's virtual environment, GFAIR_* settings: GFAIR_THROUGHPUTS would
    # hide a missing packaged table). PIP_* stays: it is how this machine reaches its index.
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYTHON", "GFAIR_", "VIRTUAL_ENV"))
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _check(step: str, process: subprocess.CompletedProcess[str]) -> None:
    assert process.returncode == 0, (
        f"{step} exited {process.returncode}\n{process.stdout[-4000:]}{process.stderr[-4000:]}"
    )


def _step(step: str, *args: str, cwd: Path, env: dict[str, str], timeout: float) -> None:
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    _check(step, done)


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Install:
    root = tmp_path_factory.mktemp("wheel")
    workdir, dist, venv = root / "elsewhere", root / "dist", root / "venv"
    workdir.mkdir()
    env = _bare_environment(venv)
    pip = (sys.executable, "-m", "pip")
    _step("pip wheel", *pip, "wheel", "--no-deps", "--quiet", "--wheel-dir", str(dist), str(REPO),
          cwd=workdir, env=env, timeout=180)  # fmt: skip
    (wheel,) = dist.glob("gfair-*.whl")
    # No pip inside: the developer's pip installs into it (`--python`), which saves seeding one.
    _step("venv", sys.executable, "-m", "venv", "--without-pip", str(venv),
          cwd=workdir, env=env, timeout=60)  # fmt: skip
    # Pinned as the container image is; the checkout's constraints file is read here, at
    # install time, never by the installed package.
    _step("pip install", *pip, "--python", str(venv / "bin" / "python"), "install", "--quiet",
          "--no-compile", "-c", str(REPO / "constraints.txt"), str(wheel),
          cwd=workdir, env=env, timeout=300)  # fmt: skip
    return Install(wheel=wheel, venv=venv, workdir=workdir)


def test_the_wheel_carries_the_reference_data(install: Install) -> None:
    names = set(zipfile.ZipFile(install.wheel).namelist())
    assert {"gfair/data/philly_trace.csv.xz", "gfair/data/gavel_alone.json"} <= names
    # The repository's own data folder (the full Gavel table) stays out of the wheel.
    assert not any(name.startswith("data/") for name in names)


def test_the_installed_package_cannot_see_the_repository(install: Install) -> None:
    probe = install.run(
        str(install.venv / "bin" / "python"),
        "-c",
        "import json, sys, gfair, gfair_services; "
        "print(json.dumps([gfair.__file__, gfair_services.__file__, sys.path]))",
    )
    _check("import", probe)
    gfair_file, services_file, path = json.loads(probe.stdout)
    site = install.venv.resolve()
    assert Path(gfair_file).resolve().is_relative_to(site)
    assert Path(services_file).resolve().is_relative_to(site)
    assert not [entry for entry in path if entry and Path(entry).resolve().is_relative_to(REPO)]


def test_gfair_help_lists_the_commands(install: Install) -> None:
    shown = install.gfair("--help")
    _check("gfair --help", shown)
    for command in ("simulate", "up", "demo", "submit", "service"):
        assert command in shown.stdout


def test_gfair_simulate_replays_the_packaged_trace(install: Install) -> None:
    report_path = install.workdir / "report.json"
    replayed = install.gfair("simulate", *SHORT_REPLAY, "--report", str(report_path))
    _check("gfair simulate", replayed)
    report = json.loads(report_path.read_text(encoding="utf-8"))
    # The default trace is the copy inside the installed package, not the checkout's.
    assert Path(report["trace"]).resolve().is_relative_to(install.venv.resolve())
    assert Path(report["trace"]).name == "philly_trace.csv.xz"
    assert report["summary"]["jobs"] > 0
    assert report["users"]
    assert report["summary"]["makespan_s"] > 0
    assert "gandiva-fair on v100:2x8,k80:2x4" in replayed.stdout
