"""Shared pieces of the supervisor tests: configs, synthetic launches, an event log."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream

import gfair
from gfair.node.job_account import JobAccount, derived_account
from gfair.node.job_runner import SupervisorConfig
from gfair.node.launch import RunSpec
from gfair.node.lifecycle import JobEvent
from support.waiting import eventually


def _open_to_others(path: Path) -> bool:
    """Whether an account other than the owner may run `path` (each directory above it
    searchable, the file executable, by others)."""
    path = path.resolve()
    return all(p.stat().st_mode & 0o001 for p in (path, *path.parents))


# The Python the tests' jobs run: as root they run as another account, which may not reach this
# interpreter (a venv's often lives under root's home); then the system's Python of the same
# version, with the SDK from this checkout on PYTHONPATH (tests/node/conftest.py; the SDK
# needs nothing but the standard library).
_VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"
JOB_PYTHON = next(
    (
        str(p)
        for p in (
            Path(sys.executable),
            Path("/usr/bin", _VERSION),
            Path("/usr/local/bin", _VERSION),
        )
        if p.exists() and _open_to_others(p)
    ),
    sys.executable,
)
LIBS = Path(gfair.__file__).resolve().parents[1]
SYNTHETIC = (JOB_PYTHON, "-m", "gfair.sdk.synthetic")
RESNET = "ResNet-50 (batch size 32)"

E = TypeVar("E", bound=JobEvent)


# As root, a supervisor runs jobs as an account of their tenant's, never as root: the tests'
# jobs run as this one (no /etc/passwd entry needed), in directories it can reach.
TEST_ACCOUNT: JobAccount | None = derived_account("test-tenant") if os.geteuid() == 0 else None


def reachable_tmp() -> Iterator[Path]:
    """A temporary directory other accounts may pass through (pytest's own are closed to them,
    so a job running as its tenant's account could not reach its directories there)."""
    path = Path(tempfile.mkdtemp(prefix="gfair-test-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def sdk_on_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK from this checkout for the jobs' Python (`JOB_PYTHON`), which may not be the
    tests' own; PYTHONPATH is one of the host variables a job inherits."""
    current = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", f"{LIBS}{os.pathsep}{current}" if current else str(LIBS))


def make_config(tmp_path: Path, **overrides: object) -> SupervisorConfig:
    settings: dict[str, object] = {
        "node_id": "node-a",
        "run_root": tmp_path / "runs",
        "checkpoint_root": tmp_path / "checkpoints",
        "gpu_indices": frozenset(range(4)),
        "term_grace_s": 1.0,
        "shutdown_timeout_s": 5.0,
        "poll_interval_s": 0.02,
        "progress_interval_s": 0.1,
        "rate_window_s": 0.5,
        "account": TEST_ACCOUNT,
    }
    settings.update(overrides)
    return SupervisorConfig(**settings)  # type: ignore[arg-type]


def synthetic(
    job_id: str,
    gpus: tuple[int, ...],
    generation: str,
    *args: str,
    **launch: object,
) -> RunSpec:
    return RunSpec(
        job_id=job_id,
        argv=(*SYNTHETIC, "--job-type", RESNET, *args),
        gpu_indices=gpus,
        generation=generation,
        **launch,  # type: ignore[arg-type]
    )


def python_job(job_id: str, code: str, *args: str, **launch: object) -> RunSpec:
    """A job that runs `code` with the jobs' Python on GPU 0 (what a hostile tenant runs)."""
    return dataclasses.replace(
        synthetic(job_id, (0,), "v100"), argv=(JOB_PYTHON, "-c", code, *args), **launch
    )


class EventLog:
    """Reads the supervisor's event stream on demand and remembers everything it saw."""

    def __init__(self, stream: MemoryObjectReceiveStream[JobEvent]) -> None:
        self._stream = stream
        self.events: list[JobEvent] = []

    def mark(self) -> int:
        """Position to search from with `first(..., after=)`."""
        self._drain()
        return len(self.events)

    async def first(
        self,
        kind: type[E],
        predicate: Callable[[E], bool] = lambda _: True,
        *,
        after: int = 0,
        timeout_s: float = 15.0,
    ) -> E:
        with anyio.fail_after(timeout_s):
            searched = after
            while True:
                for event in self.events[searched:]:
                    if isinstance(event, kind) and predicate(event):
                        return event
                searched = max(searched, len(self.events))
                self.events.append(await self._stream.receive())

    def of(self, kind: type[E], *, after: int = 0) -> list[E]:
        self._drain()
        return [e for e in self.events[after:] if isinstance(e, kind)]

    def _drain(self) -> None:
        while True:
            try:
                self.events.append(self._stream.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return


async def wait_for_text(path: Path, text: str, timeout_s: float = 15.0) -> None:
    await eventually(
        lambda: path.exists() and text in path.read_text(errors="replace"),
        timeout_s,
        what=f"{text!r} in {path.name}",
    )


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode() for k, v in pairs}
