"""One run of a job on this node: its directory, logs, control files and records.

    <run_root>/<job_id>/run-0003/
        launch.json     who started what, where (written when the process exists)
        exit.json       how it ended (absent while it runs, or when the executor died first)
        stdout.log  stderr.log
        control/        progress.jsonl (the SDK appends), yield (the supervisor creates)

`launch.json` without `exit.json` after an executor restart marks a possible orphan.

Who may read what: the directories down to a run are the executor's, mode 0711 (a job's
account passes through to its control and work directories, and lists nothing on the way), the
records and logs are the executor's alone (0600), and `control/` is the job's account's (0700).
The executor writes into the control directory, which the job owns and may fill with links:
it creates its files there without following one (`_write_json_atomically`). The directories
themselves are made and opened without following a link either (`tenant_paths`), and records
are read the same way: a link found in the run tree refuses the run rather than being followed.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from gfair.node.job_account import JobAccount
from gfair.node.job_files import open_own
from gfair.node.tenant_paths import made, make_job_directory
from gfair.sdk.environment import PARK_FILE, PROGRESS_FILE, YIELD_FILE

LAUNCH_RECORD = "launch.json"
EXIT_RECORD = "exit.json"
# Written once the scheduler was told how the run ended (or that it needed no telling): a run
# without it after its executor died is announced by the next one (`orphans`).
TOLD_RECORD = "told"
CONTROL_DIRECTORY = "control"
PASSAGE_MODE = 0o711  # searchable, not listable: a job reaches its own directories only
_PRIVATE_FILE = 0o600
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class RunDirectory:
    path: Path

    @classmethod
    def create(cls, run_root: Path, job_id: str, owner: JobAccount | None = None) -> RunDirectory:
        """A new, empty run directory for `job_id` (numbered after the existing ones), its
        control directory given to `owner` (None: it stays the executor's)."""
        run_root.mkdir(parents=True, exist_ok=True)
        with made(run_root, job_id, mode=PASSAGE_MODE) as job_dir:
            numbers = [
                int(name.removeprefix("run-"))
                for name in os.listdir(job_dir)
                if name.startswith("run-") and name.removeprefix("run-").isdigit()
            ]
            number = max(numbers, default=0) + 1
            # Another executor sharing the root may get to a number first: take the next one.
            while not _new_run(job_dir, f"run-{number:04d}", owner):
                number += 1
        return cls(run_root / job_id / f"run-{number:04d}")

    @property
    def control_dir(self) -> Path:
        return self.path / CONTROL_DIRECTORY

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

    def request_yield(self, *, park: bool = False) -> None:
        """Create the yield file atomically, so the SDK never sees a half-made one (readable by
        the job: it is the job's question). `park`: the job may yield in place."""
        _write_json_atomically(self.yield_file, {"requested": True, "park": park}, mode=0o644)

    def withdraw_yield(self) -> None:
        """The parked job resumes here: its yield is answered (unlink follows no link)."""
        with contextlib.suppress(FileNotFoundError):
            self.yield_file.unlink()

    def answer_park(self, park: int, action: str, env: Mapping[str, str] | None = None) -> None:
        """Tell the job parked in place (park number `park`) to resume or to checkpoint and exit;
        `env`: the variables a prepared start's resume sets (the GPUs it was given)."""
        answer: dict[str, Any] = {"park": park, "action": action}
        if env:
            answer["env"] = dict(env)
        _write_json_atomically(self.control_dir / PARK_FILE, answer, mode=0o644)

    def open_output(self, path: Path) -> BinaryIO:
        """`stdout.log` or `stderr.log` for appending, readable by the executor alone."""
        fd = os.open(path, _CREATE | os.O_APPEND, _PRIVATE_FILE)
        return os.fdopen(fd, "ab")

    def write_launch(self, record: dict[str, Any]) -> None:
        _write_json_atomically(self.path / LAUNCH_RECORD, record)

    def write_exit(self, record: dict[str, Any]) -> None:
        """How the run ended, its end not yet reported (`mark_told` says once it is)."""
        _write_json_atomically(self.path / EXIT_RECORD, {**record, "told": False})

    def launch_record(self) -> dict[str, Any] | None:
        return _read_json(self.path / LAUNCH_RECORD)

    def exit_record(self) -> dict[str, Any] | None:
        return _read_json(self.path / EXIT_RECORD)

    def has_exited(self) -> bool:
        return (self.path / EXIT_RECORD).exists()

    def mark_told(self) -> None:
        _write_json_atomically(self.path / TOLD_RECORD, {})

    @staticmethod
    def untold(run_root: Path) -> Iterator[RunDirectory]:
        """Runs that were launched and whose end the scheduler was never told of: still
        running, or ended as their executor died (an exit record with `told: false`). An exit
        recorded without that field was written before ends were marked told, and reported
        then: it is marked told here once, so that no restart reads it again."""
        for launch in sorted(run_root.glob(f"*/run-*/{LAUNCH_RECORD}")):
            run = RunDirectory(launch.parent)
            if (run.path / TOLD_RECORD).exists():
                continue
            ended = run.exit_record()
            if ended is None or ended.get("told") is False:
                yield run
            else:
                run.mark_told()


def _new_run(job_dir: int, name: str, owner: JobAccount | None) -> bool:
    """Make run directory `name` and its control directory; False if `name` exists."""
    try:
        with made(job_dir, name, mode=PASSAGE_MODE, exclusive=True) as run_dir:
            make_job_directory(run_dir, CONTROL_DIRECTORY, owner)
    except FileExistsError:
        return False
    return True


def _write_json_atomically(path: Path, record: dict[str, Any], mode: int = _PRIVATE_FILE) -> None:
    # A fresh name, created exclusively: a link the job put at a name this could choose is
    # never followed (O_EXCL fails on it), and the rename replaces a link instead of writing
    # through it.
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
    fd = os.open(tmp, _CREATE | os.O_EXCL, mode)
    # The mode as asked, whatever the executor's umask: the job must read its yield and park
    # files (it runs as another account).
    os.fchmod(fd, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(json.dumps(record, sort_keys=True))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open_own(path, None) as record:
            data = json.loads(record.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
