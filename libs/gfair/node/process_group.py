"""A job's process group: signal it, list and reap its members, read the end of its stderr.

Member listing reads /proc (Linux); elsewhere groups look empty and only signals work.

A job's process may leave its group (`setsid`, a daemon's double fork); such an escapee is
still found by the variable every process of the run inherits (`marked`), unless it cleared
its environment too. The job's cgroup (job_cgroup.py), where the host gives one, holds that
last one.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

from gfair.node.job_files import NotOwnFile, open_own

_PROC = Path("/proc")
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True, slots=True)
class Member:
    pid: int
    ppid: int
    zombie: bool


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to every process in the group; False when the group is already gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        # Someone else's group reuses the id: ours is gone.
        return False
    return True


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def in_group(pid: int, pgid: int) -> bool:
    """Whether `pid` is (still) a member of process group `pgid`."""
    try:
        return os.getpgid(pid) == pgid
    except ProcessLookupError:
        return False


def enable_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (Linux prctl).

    A job's daemonised children outlive its leader; without a subreaper they are re-parented to
    PID 1, which in many containers never reaps, so killed stragglers stay zombies forever and
    their process group never disappears. As subreaper the executor inherits and reaps them.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def group_members(pgid: int) -> list[Member]:
    return [
        Member(pid, ppid, state == b"Z") for pid, state, ppid, pgrp in _processes() if pgrp == pgid
    ]


def marked(name: str, value: str) -> list[Member]:
    """The processes whose environment (as they were started) holds ``name=value``."""
    needle = f"{name}={value}".encode()
    found = []
    try:
        entries = list(_PROC.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue  # exited meanwhile, or not ours to read
        fields = stat[stat.rindex(b")") + 2 :].split()
        found.append(Member(int(entry.name), int(fields[1]), fields[0] == b"Z"))
    return found


def running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        stat = (_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return process_exists(pid)  # no /proc: a signal probe is all there is
    return stat[stat.rindex(b")") + 2 :].split()[0] != b"Z"


def reap(pid: int) -> None:
    """Collect `pid`'s exit status if it is this process's exited child."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def collect(pids: set[int]) -> None:
    """Forget those of `pids` that have died, reaping the ones that are this process's children.

    A killed process leaves its cgroup and its group before it is a zombie: one is reaped only
    once it is no longer running, or its zombie would outlive the job (the executor is the
    subreaper of a job's orphans, so nobody else collects them).
    """
    for pid in list(pids):
        if not running(pid):
            reap(pid)
            pids.discard(pid)


def reap_zombies(members: list[Member]) -> int:
    """Collect the exit status of those of `members` that are this process's zombie children.

    Only exact pids are waited for, never -1, so the event loop's own child watcher (which
    waits for the leaders it started) is never robbed of an exit status.
    """
    reaped = 0
    me = os.getpid()
    for member in members:
        if member.zombie and member.ppid == me:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(member.pid, os.WNOHANG)
                reaped += 1
    return reaped


def reap_zombies_in(cgroup: str, spared: Collection[int]) -> int:
    """Collect this process's zombie children whose cgroup v2 (as ``/proc`` shows it, which it
    still does for a zombie) is `cgroup` or below it, but for `spared`; how many.

    The executor is the subreaper of its jobs' orphans: a job's child that called ``setsid``
    and exited is its zombie, in no job's process group any more, and would stay one until the
    executor exits (a job could use up the host's pids that way). Only processes of jobs run in
    job cgroups, and the job leaders the event loop waits for are `spared`, so no exit status
    anyone waits for is taken.
    """
    me, reaped = os.getpid(), 0
    for pid, state, ppid, _ in _processes():
        if state != b"Z" or ppid != me or pid in spared:
            continue
        try:
            found = (_PROC / str(pid) / "cgroup").read_text()
        except OSError:
            continue
        path = next((line[3:] for line in found.splitlines() if line.startswith("0::")), "")
        if path == cgroup or path.startswith(f"{cgroup}/"):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
                reaped += 1
    return reaped


def any_running_as(uid: int) -> bool:
    """Whether a process of `uid` (zombies aside) runs anywhere on this host."""
    for pid, state, _, _ in _processes():
        try:
            owner = (_PROC / str(pid)).stat().st_uid
        except OSError:
            continue
        if owner == uid and state != b"Z":
            return True
    return False


def _processes() -> Iterator[tuple[int, bytes, int, int]]:
    """(pid, state, parent, process group) of every process /proc shows."""
    try:
        entries = list(_PROC.iterdir())
    except OSError:
        return
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue  # exited meanwhile
        # Fields after the parenthesised command name: state, ppid, pgrp, ...
        fields = stat[stat.rindex(b")") + 2 :].split()
        yield int(entry.name), fields[0], int(fields[1]), int(fields[2])


def reap_zombie_members(pgid: int) -> int:
    """Collect the exit status of this process's zombie children in the group; how many."""
    return reap_zombies(group_members(pgid))


def read_tail(path: Path, max_bytes: int) -> str:
    """The last `max_bytes` of a log, starting at a line boundary when one is in reach."""
    try:
        # Never through a link: the tail goes to the job's tenant.
        with open_own(path, None) as fh:
            size = fh.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            fh.seek(start)
            data = fh.read()
    except (FileNotFoundError, NotOwnFile):
        return ""
    if start > 0:
        newline = data.find(b"\n")
        if 0 <= newline < len(data) - 1:
            data = data[newline + 1 :]
    return data.decode("utf-8", "replace")
