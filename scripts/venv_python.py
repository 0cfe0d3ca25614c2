"""Print the Python interpreter `make` builds `.venv` from (the Makefile's default `PYTHON`).

A node executor running as root runs every job as its tenant's own unprivileged account
(`gfair.node.job_account`), and the demo's, the benchmarks' and the tests' jobs run the
virtual environment's `python`. That interpreter must be one such an account can execute: an
installation inside root's private home (pyenv in ``/root``, mode 0700) is not, and every job
would fail with "Permission denied". So, as root, this prefers ``python3`` when every directory
above it is open to others, else the first system interpreter of 3.11 or later that is, and
says why on standard error. Anyone else gets ``python3``: their executor runs jobs as
themselves.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

DEFAULT = "python3"
MINIMUM = (3, 11)
CANDIDATES = tuple(
    f"{folder}/python3.{minor}"
    for minor in (13, 12, 11)
    for folder in ("/usr/bin", "/usr/local/bin")
)


def open_to_others(path: Path) -> bool:
    """Whether an account with no special rights can execute `path` (every folder above it
    searchable, the file itself executable)."""
    real = path.resolve()
    for folder in real.parents:
        if not folder.stat().st_mode & stat.S_IXOTH:
            return False
    return bool(real.stat().st_mode & stat.S_IXOTH)


def recent_enough(command: str) -> bool:
    probe = f"import sys, venv, ensurepip; print(sys.version_info >= {MINIMUM!r})"
    try:
        done = subprocess.run([command, "-c", probe], capture_output=True, text=True, timeout=30)
    except OSError:
        return False
    return done.returncode == 0 and done.stdout.strip() == "True"


def checkout_is_open() -> bool:
    """Whether the jobs' accounts can reach this checkout, where `.venv` and the code live."""
    checkout = Path(__file__).resolve().parents[1]
    return all(folder.stat().st_mode & stat.S_IXOTH for folder in (checkout, *checkout.parents))


def choose() -> str:
    if os.geteuid() == 0 and not checkout_is_open():
        print(
            "venv: this checkout lies in a folder closed to other accounts: the jobs, which "
            "run as their tenants' accounts, will not reach .venv (clone it elsewhere)",
            file=sys.stderr,
        )
    found = shutil.which(DEFAULT)
    if os.geteuid() != 0 or found is None or open_to_others(Path(found)):
        return DEFAULT
    for candidate in CANDIDATES:
        path = Path(candidate)
        if path.exists() and open_to_others(path) and recent_enough(candidate):
            print(
                f"venv: {found} lies where the jobs' accounts cannot run it; using {candidate}",
                file=sys.stderr,
            )
            return candidate
    print(
        f"venv: {found} lies where the jobs' accounts cannot run it, and no other Python "
        f"{MINIMUM[0]}.{MINIMUM[1]}+ was found: jobs of the demo will fail to start "
        "(set PYTHON=/path/to/python3 for make)",
        file=sys.stderr,
    )
    return DEFAULT


if __name__ == "__main__":
    print(choose())
