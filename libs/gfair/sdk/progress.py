"""Progress records: the job appends JSON lines to a file, the node supervisor tails it.

A file rather than a socket: it needs no server in the job, survives the supervisor restarting,
and costs one buffered write per mini-batch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, get_args

RecordKind = Literal["ready", "step", "checkpoint", "yield", "parked", "resumed", "complete"]
_KINDS: frozenset[str] = frozenset(get_args(RecordKind))
# Records the supervisor must see promptly: they change what it reports or decides.
_URGENT: frozenset[str] = frozenset(
    {"ready", "checkpoint", "yield", "parked", "resumed", "complete"}
)


@dataclass(frozen=True, slots=True)
class ProgressRecord:
    """One line of the progress file.

    kinds: `ready` (the SDK is up; `pid` and whether it handles SIGUSR1), `step` (mini-batch
    `step` finished), `checkpoint` (checkpoint `checkpoint_seq` of `step` is durable),
    `yield` (the job is exiting because it was asked to), `parked` (it yielded in place: its
    state is in host memory, its GPUs are free, and it waits for the executor's answer to park
    number `park`), `resumed` (it continues in the same process after park `park`),
    `complete` (training finished).
    """

    kind: RecordKind
    time: float
    step: int | None = None
    pid: int | None = None
    handles_sigusr1: bool = False
    checkpoint_seq: int | None = None
    checkpoint_path: str | None = None
    park: int | None = None

    def to_json(self) -> str:
        data: dict[str, Any] = {"kind": self.kind, "time": round(self.time, 6)}
        if self.step is not None:
            data["step"] = self.step
        if self.pid is not None:
            data["pid"] = self.pid
            data["handles_sigusr1"] = self.handles_sigusr1
        if self.checkpoint_seq is not None:
            data["checkpoint_seq"] = self.checkpoint_seq
            data["checkpoint_path"] = self.checkpoint_path
        if self.park is not None:
            data["park"] = self.park
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> ProgressRecord:
        """Parse one line; ValueError names what is wrong."""
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("progress record is not a JSON object")
        kind = data.get("kind")
        if kind not in _KINDS:
            raise ValueError(f"progress record has unknown kind {kind!r}")
        when = data.get("time")
        if not isinstance(when, int | float):
            raise ValueError("progress record has no numeric time")
        return cls(
            kind=kind,
            time=float(when),
            step=_optional_int(data, "step"),
            pid=_optional_int(data, "pid"),
            handles_sigusr1=bool(data.get("handles_sigusr1", False)),
            checkpoint_seq=_optional_int(data, "checkpoint_seq"),
            checkpoint_path=_optional_str(data, "checkpoint_path"),
            park=_optional_int(data, "park"),
        )


class ProgressLog:
    """Appends records to the progress file (or nowhere, outside gfair).

    Step records are buffered and flushed at most every `flush_interval_s`, so a job doing
    thousands of mini-batches a second does not make thousands of system calls; a job slower
    than that flushes every record. Other kinds are flushed at once.
    """

    def __init__(
        self,
        path: Path | None,
        *,
        flush_interval_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._file: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8", buffering=64 * 1024)
        self._flush_interval_s = flush_interval_s
        self._clock = clock
        self._last_flush = float("-inf")

    def append(self, record: ProgressRecord) -> None:
        if self._file is None:
            return
        self._file.write(record.to_json() + "\n")
        now = self._clock()
        if record.kind in _URGENT or now - self._last_flush >= self._flush_interval_s:
            self._file.flush()
            self._last_flush = now

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
            self._last_flush = self._clock()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _optional_int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"progress record field {key!r} must be an integer, got {value!r}")
    return value


def _optional_str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"progress record field {key!r} must be a string, got {value!r}")
    return value
