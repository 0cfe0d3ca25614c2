"""Reading a job's progress file as it grows, and turning step reports into a rate."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import BinaryIO

from gfair.node.job_files import NotOwnFile, open_own
from gfair.sdk.progress import ProgressRecord


class ProgressTail:
    """Returns the records appended to a progress file since the last read.

    Tolerates the file not existing yet (the job is still importing), a half-written last line
    (kept until its newline arrives) and garbage lines (counted, skipped: a job's bad output
    must not take the supervisor down). The file must be the job's own (`owner`'s, no link):
    one that is not is never read (`refused` says why).
    """

    def __init__(self, path: Path, owner: int | None = None) -> None:
        self.path = path
        self.owner = owner
        self._file: BinaryIO | None = None
        self._partial = b""
        self.malformed = 0
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
        chunk = self._file.read()
        if not chunk:
            return []
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        records = []
        for line in lines:
            if not line.strip():
                continue
            try:
                records.append(ProgressRecord.from_json(line.decode("utf-8")))
            except ValueError as exc:  # includes JSON and UTF-8 decoding errors
                self.malformed += 1
                self.last_error = str(exc)
        return records

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


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
