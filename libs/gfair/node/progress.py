"""Reading a job's progress file as it grows, and turning step reports into a rate."""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gfair.node.job_files import NotOwnFile, open_own
from gfair.sdk.progress import ProgressRecord

_log = logging.getLogger("gfair.node")

# How often one tail may say what it skipped: a hostile job must not flood the node's log either.
_WARN_EVERY_S = 60.0


@dataclass(frozen=True, slots=True)
class ProgressLimits:
    """What one read of a job's progress file may cost the supervisor, whatever the job writes.

    The SDK writes a line of about 100 bytes at most every 0.2 s (and a few others around a
    switch), so an honest job never comes near these: they bound a job that writes flat out.
    """

    # Bytes read at most per read: the memory and the parsing time of one read.
    read_bytes: int = 64 * 1024
    # A longer line is skipped and counted as malformed.
    max_line_bytes: int = 4096
    # Records kept per second (one second's worth may come at once); runs of steps are first
    # reduced to their first and last, which is all the rate and the step count need.
    records_per_s: float = 50.0
    # Unread bytes beyond this are skipped: only the newest records matter (the steps, the
    # rate), and a reader that fell behind a flood must not read its whole history.
    backlog_bytes: int = 1024 * 1024
    # A file read to its end past this is emptied (`shrink`): an honest job gets there in
    # days, a flood in seconds, and the node's disk is every tenant's.
    file_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.read_bytes <= 0 or self.max_line_bytes <= 0 or self.backlog_bytes <= 0:
            raise ValueError("progress limits: sizes must be positive")
        if self.records_per_s <= 0:
            raise ValueError("progress limits: records_per_s must be positive")


class ProgressTail:
    """Returns the records appended to a progress file since the last read.

    Tolerates the file not existing yet (the job is still importing), a half-written last line
    (kept until its newline arrives) and garbage lines (counted, skipped: a job's bad output
    must not take the supervisor down). The file must be the job's own (`owner`'s, no link):
    one that is not is never read (`refused` says why). One read costs at most `limits`, and
    what went over them is counted (`malformed`, `dropped`, `skipped_bytes`) and logged.
    """

    def __init__(
        self,
        path: Path,
        owner: int | None = None,
        limits: ProgressLimits = ProgressLimits(),
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.owner = owner
        self.limits = limits
        self._clock = clock
        self._file: BinaryIO | None = None
        self._partial = b""
        # Inside a line over the length limit (or cut by a skip): dropped up to its newline.
        self._skipping = False
        self._tokens = limits.records_per_s
        self._refilled = clock()
        self._warned_at = -math.inf
        self._warned: tuple[int, int, int] = (0, 0, 0)
        self.malformed = 0
        self.dropped = 0
        self.skipped_bytes = 0
        self.last_error: str | None = None
        self.refused: str | None = None

    def read(self) -> list[ProgressRecord]:
        if self.refused is not None:
            return []
        if self._file is None:
            try:
                self._file = open_own(self.path, self.owner)
            except FileNotFoundError:
                return []
            except NotOwnFile as error:
                self.refused = self.last_error = str(error)
                return []
        self._skip_backlog(self._file)
        chunk = self._file.read(self.limits.read_bytes)
        if not chunk:
            return []
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        if self._skipping and lines:
            lines.pop(0)  # the end of the line being skipped
            self._skipping = False
        if self._skipping:
            self._partial = b""
        elif len(self._partial) > self.limits.max_line_bytes:
            self._partial, self._skipping = b"", True
            self._malformed(f"a line longer than {self.limits.max_line_bytes} bytes")
        records = self._within_rate(_coalesced(self._parsed(lines)))
        self._warn()
        return records

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def shrink(self) -> bool:
        """Empty the file once it is over `ProgressLimits.file_bytes` and read to its end;
        whether it was. A record the job appends between the last read and this is lost: the
        caller calls it only while none it waits for can come (not while the job parks)."""
        file = self._file
        if file is None:
            return False
        size, read_to = os.fstat(file.fileno()).st_size, file.tell()
        # Read to its end (an honest job's file, after days), or a flood the reader skips
        # through anyway: what it has not read yet is lost with it.
        caught_up = size == read_to and not self._partial
        if not (caught_up and size > self.limits.file_bytes) and size <= 2 * self.limits.file_bytes:
            return False
        # Through the descriptor the tail holds (its owner checked when it was opened), never
        # by name: the job may have put a link there since.
        with open(f"/proc/self/fd/{file.fileno()}", "r+b") as same:
            same.truncate(0)
        file.seek(0)
        if not caught_up:
            self.skipped_bytes += size - read_to
            self._partial, self._skipping = b"", True  # a write under way ends mid-line
        return True

    def _skip_backlog(self, file: BinaryIO) -> None:
        position = file.tell()
        behind = os.fstat(file.fileno()).st_size - position
        if behind <= self.limits.backlog_bytes:
            return
        skip = behind - self.limits.read_bytes
        file.seek(position + skip)
        self.skipped_bytes += skip
        # Where the read resumes is most likely the middle of a line.
        self._partial, self._skipping = b"", True

    def _parsed(self, lines: list[bytes]) -> list[ProgressRecord]:
        records = []
        for line in lines:
            if not line.strip():
                continue
            if len(line) > self.limits.max_line_bytes:
                self._malformed(f"a line longer than {self.limits.max_line_bytes} bytes")
                continue
            try:
                records.append(ProgressRecord.from_json(line.decode("utf-8")))
            except Exception as exc:  # whatever a line makes the parser raise, it is the job's
                self._malformed(f"{type(exc).__name__}: {exc}")
        return records

    def _within_rate(self, records: list[ProgressRecord]) -> list[ProgressRecord]:
        now = self._clock()
        rate = self.limits.records_per_s
        self._tokens = min(rate, self._tokens + (now - self._refilled) * rate)
        self._refilled = now
        kept = min(len(records), int(self._tokens))
        self._tokens -= kept
        self.dropped += len(records) - kept
        return records[:kept]

    def _malformed(self, why: str) -> None:
        self.malformed += 1
        self.last_error = why

    def _warn(self) -> None:
        counts = (self.malformed, self.dropped, self.skipped_bytes)
        now = self._clock()
        if counts == self._warned or now - self._warned_at < _WARN_EVERY_S:
            return
        self._warned, self._warned_at = counts, now
        _log.warning(
            "progress file %s: skipped %d malformed lines (last: %s), dropped %d records over "
            "%g a second and %d bytes of backlog so far",
            self.path,
            self.malformed,
            self.last_error,
            self.dropped,
            self.limits.records_per_s,
            self.skipped_bytes,
        )


def _coalesced(records: list[ProgressRecord]) -> list[ProgressRecord]:
    """Each run of consecutive steps reduced to its first and last: the first times a start or
    a resume, the last carries the count; those between add nothing the rate needs."""
    kept: list[ProgressRecord] = []
    for index, record in enumerate(records):
        if (
            record.kind == "step"
            and 0 < index < len(records) - 1
            and records[index - 1].kind == "step"
            and records[index + 1].kind == "step"
        ):
            continue
        kept.append(record)
    return kept


class RateWindow:
    """Mini-batches per second over the last `window_s` of reports (by the job's timestamps)."""

    def __init__(self, window_s: float) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.window_s = window_s
        self._points: deque[tuple[float, int]] = deque()

    def add(self, time: float, steps: int) -> None:
        self._points.append((time, steps))
        horizon = time - self.window_s
        # Keep one point at or before the horizon so the window spans the full width.
        while len(self._points) > 2 and self._points[1][0] <= horizon:
            self._points.popleft()

    def rate(self) -> float | None:
        if len(self._points) < 2:
            return None
        (t0, s0), (t1, s1) = self._points[0], self._points[-1]
        if t1 <= t0:
            return None
        return (s1 - s0) / (t1 - t0)
