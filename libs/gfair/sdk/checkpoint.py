"""Atomic, versioned checkpoints in one directory per job.

Layout of a job's checkpoint directory (shared by every node executor that may resume the job):

    ckpt-000000000007/            committed checkpoint number 7 (the newest)
        gfair-checkpoint.json     manifest: seq, step, time, JSON state, sizes of the other files
        model.pt ...              whatever the training script wrote
    ckpt-000000000006/            the previous one, kept as the fallback
    .staging-8-4242-1a2b3c/       a checkpoint being written (ignored by readers)

A checkpoint is written into a staging directory, every file is fsync'ed, the manifest is written
last, and the directory is renamed into place: a reader sees a whole checkpoint or none. A job
killed half-way leaves only a staging directory, so the previous checkpoint stays the newest.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

MANIFEST_NAME = "gfair-checkpoint.json"
MANIFEST_FORMAT = 1
_COMMITTED_PREFIX = "ckpt-"
_STAGING_PREFIX = ".staging-"
# Another writer's staging directory untouched this long is an abandoned write. Far longer than
# writing one checkpoint takes, which is what a gang's other part may be doing at the moment.
STALE_STAGING_S = 3600.0

# Return values are ignored, so `lambda fh: fh.write(data)` works as a writer.
FileWriter = Callable[[BinaryIO], object]


class CheckpointError(Exception):
    """A checkpoint directory is missing, incomplete or corrupt."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One committed checkpoint."""

    seq: int
    step: int
    path: Path
    created_at: float
    state: Mapping[str, Any]
    files: tuple[str, ...]

    def file(self, name: str) -> Path:
        """Path of a file the training script stored with this checkpoint."""
        if name not in self.files:
            raise CheckpointError(f"checkpoint {self.path} has no file {name!r}")
        return self.path / name


@dataclass(slots=True)
class CheckpointDraft:
    """A checkpoint being written: files go into `path`; `committed` is set once it is durable."""

    path: Path
    committed: Checkpoint | None = None


def read_checkpoint(path: Path) -> Checkpoint:
    """Read and verify one committed checkpoint directory."""
    seq = _committed_seq(path.name)
    if seq is None:
        raise CheckpointError(f"{path} is not a committed checkpoint directory")
    manifest_path = path / MANIFEST_NAME
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{manifest_path} is missing") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{manifest_path} is unreadable: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise CheckpointError(f"{manifest_path}: unknown manifest format")
    if manifest.get("seq") != seq:
        raise CheckpointError(f"{manifest_path}: seq {manifest.get('seq')} != directory {seq}")
    step, state, sizes = manifest.get("step"), manifest.get("state"), manifest.get("files")
    if not isinstance(step, int) or not isinstance(state, dict) or not isinstance(sizes, dict):
        raise CheckpointError(f"{manifest_path}: step, state or files is malformed")
    for name, size in sizes.items():
        try:
            actual = (path / name).stat().st_size
        except OSError:
            raise CheckpointError(f"{path}: file {name!r} is missing") from None
        if actual != size:
            raise CheckpointError(f"{path}: file {name!r} has {actual} bytes, expected {size}")
    return Checkpoint(
        seq=seq,
        step=step,
        path=path,
        created_at=float(manifest.get("created_at", 0.0)),
        state=state,
        files=tuple(sorted(sizes)),
    )


def checkpoint_bytes(path: Path) -> int | None:
    """The size of a committed checkpoint's files, from its manifest; None if unreadable."""
    try:
        manifest = json.loads((path / MANIFEST_NAME).read_text(encoding="utf-8"))
        sizes = manifest["files"]
        return int(sum(int(size) for size in sizes.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


class CheckpointStore:
    """The checkpoints of one job: list, read, and write them atomically, keeping a fallback."""

    def __init__(self, root: Path, *, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = root
        self.keep = keep
        self._token = f"{os.getpid()}-{os.urandom(3).hex()}"

    def checkpoints(self) -> list[Checkpoint]:
        """Valid committed checkpoints, newest first; corrupt ones are skipped."""
        found: list[Checkpoint] = []
        for _, path in self._committed_dirs():
            with contextlib.suppress(CheckpointError):
                found.append(read_checkpoint(path))
        return found

    def latest(self) -> Checkpoint | None:
        """The newest valid checkpoint (an older one when the newest is damaged), or None."""
        for _, path in self._committed_dirs():
            with contextlib.suppress(CheckpointError):
                return read_checkpoint(path)
        return None

    def save(
        self,
        state: Mapping[str, Any],
        *,
        step: int,
        files: Mapping[str, FileWriter] | None = None,
    ) -> Checkpoint:
        """Write a checkpoint: JSON `state` plus one file per `files` entry, via its writer."""
        seq, staging, state_json = self._begin(state, step)
        try:
            for name, writer in (files or {}).items():
                target = _safe_child(staging, name)
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("wb") as fh:
                    writer(fh)
            checkpoint = self._commit(staging, seq, step, state_json)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self._prune()
        return checkpoint

    @contextlib.contextmanager
    def stage(self, state: Mapping[str, Any], *, step: int) -> Iterator[CheckpointDraft]:
        """Yield a draft whose empty `path` takes the files; commit it when the block ends cleanly.

        An exception inside the block discards the draft and commits nothing.
        """
        seq, staging, state_json = self._begin(state, step)
        draft = CheckpointDraft(path=staging)
        try:
            yield draft
            draft.committed = self._commit(staging, seq, step, state_json)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self._prune()

    def _begin(self, state: Mapping[str, Any], step: int) -> tuple[int, Path, dict[str, Any]]:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        try:
            # A round trip so the manifest holds exactly what a reader will get back.
            state_json: dict[str, Any] = json.loads(json.dumps(dict(state), allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"checkpoint state must be JSON-serialisable: {exc}") from None
        self.root.mkdir(parents=True, exist_ok=True)
        seq = self._next_seq()
        staging = self.root / f"{_STAGING_PREFIX}{seq}-{self._token}"
        staging.mkdir()
        return seq, staging, state_json

    def _commit(self, staging: Path, seq: int, step: int, state: dict[str, Any]) -> Checkpoint:
        sizes: dict[str, int] = {}
        for path in sorted(staging.rglob("*")):
            if path.is_file():
                _fsync_file(path)
                sizes[path.relative_to(staging).as_posix()] = path.stat().st_size
        if MANIFEST_NAME in sizes:
            raise ValueError(f"{MANIFEST_NAME} is reserved for gfair's manifest")
        created_at = time.time()
        for directory in [staging, *sorted(p for p in staging.rglob("*") if p.is_dir())]:
            _fsync_dir(directory)
        while True:
            _write_manifest(staging, seq, step, created_at, state, sizes)
            final = self.root / f"{_COMMITTED_PREFIX}{seq:012d}"
            try:
                # Fails, rather than replaces, when the name is taken (a non-empty directory).
                staging.rename(final)
                break
            except OSError:
                if not final.exists():
                    raise
            # The parts of a gang on several servers write the job's checkpoints side by side;
            # another part committed this number first: commit as the next one.
            seq = self._next_seq()
        _fsync_dir(self.root)
        return Checkpoint(seq, step, final, created_at, state, tuple(sorted(sizes)))

    def _prune(self) -> None:
        valid = [c.seq for c in self.checkpoints()]
        if len(valid) <= self.keep:
            oldest_kept = valid[-1] if valid else 0
        else:
            oldest_kept = valid[self.keep - 1]
        for seq, path in self._committed_dirs():
            if seq < oldest_kept:
                shutil.rmtree(path, ignore_errors=True)
        # Old staging directories of other writers belong to earlier attempts that died
        # mid-write; a fresh one may be another part of the same gang, writing right now.
        stale_before = time.time() - STALE_STAGING_S
        for path in self.root.glob(f"{_STAGING_PREFIX}*"):
            if not path.name.endswith(self._token) and _modified_at(path) < stale_before:
                shutil.rmtree(path, ignore_errors=True)

    def _next_seq(self) -> int:
        seqs = [seq for seq, _ in self._committed_dirs()]
        for path in self.root.glob(f"{_STAGING_PREFIX}*"):
            head = path.name.removeprefix(_STAGING_PREFIX).split("-", 1)[0]
            if head.isdigit():
                seqs.append(int(head))
        return max(seqs, default=0) + 1

    def _committed_dirs(self) -> list[tuple[int, Path]]:
        """Committed checkpoint directories (valid or not), newest first."""
        try:
            entries = list(self.root.iterdir())
        except FileNotFoundError:
            return []
        dirs = [(seq, p) for p in entries if (seq := _committed_seq(p.name)) is not None]
        return sorted(dirs, reverse=True)


def _committed_seq(name: str) -> int | None:
    digits = name.removeprefix(_COMMITTED_PREFIX)
    if digits == name or not digits.isdigit():
        return None
    return int(digits)


def _write_manifest(
    staging: Path,
    seq: int,
    step: int,
    created_at: float,
    state: dict[str, Any],
    sizes: dict[str, int],
) -> None:
    manifest = {
        "format": MANIFEST_FORMAT,
        "seq": seq,
        "step": step,
        "created_at": created_at,
        "state": state,
        "files": sizes,
    }
    with (staging / MANIFEST_NAME).open("w", encoding="utf-8") as fh:
        json.dump(manifest, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(staging)


def _modified_at(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return time.time()  # removed meanwhile: nothing to prune


def _safe_child(root: Path, name: str) -> Path:
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise ValueError(f"checkpoint file name {name!r} must be a relative path inside it")
    return root / relative


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
