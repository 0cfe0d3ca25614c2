"""Progress records: the job appends JSON lines to a file, the node supervisor tails it.

A file rather than a socket: it needs no server in the job and survives the supervisor
restarting. A job may do thousands of mini-batches a second, and the supervisor shares the
node's CPUs with it: so not every mini-batch is a record. The first after the job's start or
an in-place resume is written at once (it times the switch), then at most one every
`step_interval_s`, the newest; and the newest is written before any other record (a park, a
yield, a checkpoint, the end), so each run of steps is recorded exactly at both ends.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, get_args

RecordKind = Literal["ready", "step", "checkpoint", "yield", "parked", "resumed", "complete"]
_KINDS: frozenset[str] = frozenset(get_args(RecordKind))
# After these, the next mini-batch is news at once: how long the start or resume took.
_BEFORE_FIRST_STEP: frozenset[str] = frozenset({"ready", "resumed"})


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
        try:
            seconds = float(when)
        except OverflowError:  # an integer of hundreds of digits
            raise ValueError("progress record's time is out of range") from None
        if not math.isfinite(seconds):
            raise ValueError("progress record's time is not finite")
        return cls(
            kind=kind,
            time=seconds,
            step=_optional_int(data, "step"),
            pid=_optional_int(data, "pid"),
            handles_sigusr1=bool(data.get("handles_sigusr1", False)),
            checkpoint_seq=_optional_int(data, "checkpoint_seq"),
            checkpoint_path=_optional_str(data, "checkpoint_path"),
            park=_optional_int(data, "park"),
        )


class ProgressLog:
    """Appends records to the progress file (or nowhere, outside gfair), each flushed at once;
    mini-batches through `step`, sampled (module doc)."""

    def __init__(
        self,
        path: Path | None,
        *,
        step_interval_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._file: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8")
        self._step_interval_s = step_interval_s
        self._clock = clock
        # When the next mini-batch is written rather than kept (by `clock`).
        self._next_step = float("-inf")
        # The newest mini-batch not written yet: (steps done, its time).
        self._pending: tuple[int, float] | None = None

    def step(self, step: int, at: float) -> None:
        """Mini-batches done (`step`) at time `at`: written when one is due, else kept."""
        if self._file is None:
            return
        now = self._clock()
        if now < self._next_step:
            self._pending = (step, at)
            return
        self._pending = None
        self._next_step = now + self._step_interval_s
        self._write(ProgressRecord(kind="step", time=at, step=step))

    def append(self, record: ProgressRecord) -> None:
        if self._file is None:
            return
        self._write_pending()
        self._write(record)
        if record.kind in _BEFORE_FIRST_STEP:
            self._next_step = float("-inf")

    def flush(self) -> None:
        """Write the newest mini-batch if it is not yet (at exit: the run's last)."""
        if self._file is not None:
            self._write_pending()

    def close(self) -> None:
        if self._file is not None:
            self._write_pending()
            self._file.close()
            self._file = None

    def _write_pending(self) -> None:
        if self._pending is not None:
            step, at = self._pending
            self._pending = None
            self._write(ProgressRecord(kind="step", time=at, step=step))

    def _write(self, record: ProgressRecord) -> None:
        assert self._file is not None
        self._file.write(record.to_json() + "\n")
        self._file.flush()


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
