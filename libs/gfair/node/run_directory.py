"""One run of a job on this node: its directory, logs, control files and records.

    <run_root>/<job_id>/run-0003/
        launch.json     who started what, where (written when the process exists)
        exit.json       how it ended (absent while it runs, or when the executor died first)
        stdout.log  stderr.log
        control/        progress.jsonl (the SDK appends), yield (the supervisor creates)

`launch.json` without `exit.json` after an executor restart marks a possible orphan.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gfair.sdk.environment import PROGRESS_FILE, YIELD_FILE

LAUNCH_RECORD = "launch.json"
EXIT_RECORD = "exit.json"


@dataclass(frozen=True, slots=True)
class RunDirectory:
    path: Path

    @classmethod
    def create(cls, run_root: Path, job_id: str) -> RunDirectory:
        """A new, empty run directory for `job_id` (numbered after the existing ones)."""
        job_dir = run_root / job_id
        job_dir.mkdir(parents=True, exist_ok=True)
        numbers = [
            int(p.name.removeprefix("run-"))
            for p in job_dir.glob("run-*")
            if p.name.removeprefix("run-").isdigit()
        ]
        number = max(numbers, default=0) + 1
        while True:
            path = job_dir / f"run-{number:04d}"
            try:
                path.mkdir()
            except FileExistsError:  # another executor sharing the root got there first
                number += 1
                continue
            run = cls(path)
            run.control_dir.mkdir()
            return run

    @property
    def control_dir(self) -> Path:
        return self.path / "control"

    @property
    def progress_file(self) -> Path:
        return self.control_dir / PROGRESS_FILE

    @property
    def yield_file(self) -> Path:
        return self.control_dir / YIELD_FILE

    @property
    def stdout(self) -> Path:
        return self.path / "stdout.log"

    @property
    def stderr(self) -> Path:
        return self.path / "stderr.log"

    def request_yield(self) -> None:
        """Create the yield file atomically, so the SDK never sees a half-made one."""
        _write_json_atomically(self.yield_file, {"requested": True})

    def write_launch(self, record: dict[str, Any]) -> None:
        _write_json_atomically(self.path / LAUNCH_RECORD, record)

    def write_exit(self, record: dict[str, Any]) -> None:
        _write_json_atomically(self.path / EXIT_RECORD, record)

    def launch_record(self) -> dict[str, Any] | None:
        return _read_json(self.path / LAUNCH_RECORD)

    def has_exited(self) -> bool:
        return (self.path / EXIT_RECORD).exists()

    @staticmethod
    def unfinished(run_root: Path) -> Iterator[RunDirectory]:
        """Runs that were launched and never recorded an exit."""
        for launch in sorted(run_root.glob(f"*/run-*/{LAUNCH_RECORD}")):
            run = RunDirectory(launch.parent)
            if not run.has_exited():
                yield run


def _write_json_atomically(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(record, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
