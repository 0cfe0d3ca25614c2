"""The last start command of each job this node ran, kept on disk in the work root.

A resume command names only the job and its GPUs: the command line, environment and working
directory come from the job's last start here, which must outlive a restart of the executor.
Files are private to the executor's user (they hold the job's environment).
"""

from __future__ import annotations

import os
from pathlib import Path

from gfair.events.commands import StartCommand
from gfair.events.fields import JobRef


class LaunchBook:
    def __init__(self, root: Path) -> None:
        self._root = root

    def _path(self, job: JobRef) -> Path:
        # User and job id are subject tokens: safe as path components.
        return self._root / job.user / f"{job.job_id}.json"

    def save(self, command: StartCommand) -> None:
        path = self._path(command.job)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = path.with_suffix(".json.tmp")
        descriptor = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(command.model_dump_json())
        staging.replace(path)

    def load(self, job: JobRef) -> StartCommand | None:
        try:
            return StartCommand.model_validate_json(self._path(job).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
