"""The supervisor's jobs run as another account when the tests run as root (CI does)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import LIBS, reachable_tmp


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """pytest's `tmp_path`, but reachable by the jobs' account (see `reachable_tmp`)."""
    yield from reachable_tmp()


@pytest.fixture(autouse=True)
def sdk_for_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK from this checkout for the jobs' Python (`JOB_PYTHON`), which may not be the
    tests' own; PYTHONPATH is one of the host variables a job inherits."""
    current = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", f"{LIBS}{os.pathsep}{current}" if current else str(LIBS))
