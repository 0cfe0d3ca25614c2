"""CPU time used by a benchmark's processes, by role, while it runs (Linux, from /proc).

A thread reads ``/proc/<pid>/stat`` of every descendant of this process every `interval_s`:
nats-server, each service, the node executors and the jobs they start. A process's CPU is its
user + system time at its last reading, so one that exits between two readings loses at most
an interval's worth: the jobs that run for seconds are counted almost whole, a yield's
short-lived helper may be missed. Roles come from the command line (`role_of`).
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
# The role of a process `role_of` does not recognise (yet: a job's gate before its exec).
OTHER = "other"


def process_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of `pid`, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


class ProcessCpu:
    """Samples the CPU time of this process's descendants while in its `with` block."""

    def __init__(self, role_of: Callable[[list[str]], str], interval_s: float = 0.1) -> None:
        self._role_of = role_of
        self._interval_s = interval_s
        self._root = os.getpid()
        self._cpu: dict[int, float] = {}
        self._role: dict[int, str] = {}
        # Seen and not ours: never read again (the other work on a shared box).
        self._foreign: set[int] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="process-cpu", daemon=True)

    def __enter__(self) -> ProcessCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self._thread.join()

    def used(self) -> dict[str, float]:
        """CPU seconds per role so far (read now)."""
        self._sample()
        with self._lock:
            used: dict[str, float] = defaultdict(float)
            for pid, seconds in self._cpu.items():
                used[self._role[pid]] += seconds
            return dict(used)

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            self._sample()

    def _sample(self) -> None:
        with self._lock:
            self._sample_locked()

    def _sample_locked(self) -> None:
        parents: dict[int, int] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if pid in self._foreign:
                continue
            found = process_stat(pid)
            if found is None:
                continue
            parent, seconds = found
            parents[pid] = parent
            if pid in self._role:
                self._cpu[pid] = seconds
        # New processes: ours when their parent is (parents appear before their children
        # mostly, so a few rounds settle the whole tree).
        ours = {self._root, *self._role}
        changed = True
        while changed:
            changed = False
            for pid, parent in parents.items():
                if pid not in ours and parent in ours:
                    ours.add(pid)
                    changed = True
        for pid in parents:
            if pid in self._role or pid == self._root:
                continue
            if pid in ours:
                # Read again now: an exec (the job's gate) changes its command line.
                self._role[pid] = self._role_of(_cmdline(pid))
                found = process_stat(pid)
                self._cpu[pid] = found[1] if found is not None else 0.0
            else:
                self._foreign.add(pid)
        for pid in list(self._role):
            if self._role[pid] == OTHER and pid in parents:
                self._role[pid] = self._role_of(_cmdline(pid))
