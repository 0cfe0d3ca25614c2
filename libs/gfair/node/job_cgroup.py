"""A cgroup (v2) per job, where the host lets the executor make them, so that every process of
a job goes with it: one that left its process group (`setsid`) and cleared its environment too,
which the process group and the run's marker variable cannot find (process_group.py).

Job cgroups live under the executor's own cgroup (`CgroupTree` names them). A job's process
enters its cgroup before it runs any code of the job's (`gfair.node.job_entry`), so nothing the
job forks is ever outside it. Stopping a job writes ``cgroup.kill``, which the kernel applies to
every process inside at once.

Where no writable cgroup2 hierarchy is mounted (cgroup v1 only; a container whose
``/sys/fs/cgroup`` is read-only; an executor that is not root and was delegated no subtree),
`locate` finds none in ``auto`` mode and jobs run without: the process group, the marker and the
executor as subreaper then hold all but a process that both left the group and cleared its
environment. Memory and CPU limits are `gfair.node.job_limits`'.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gfair.node.process_group import collect

AUTO = "auto"
OFF = "off"
_KILL_WAIT_S = 5.0
# The kernel freezes a cgroup's processes as each next leaves the kernel: at once but for one
# stuck in uninterruptible I/O.
_FREEZE_WAIT_S = 2.0


class CgroupError(RuntimeError):
    """The job cgroup setting names something that cannot hold jobs."""


def cgroup2_mount(mountinfo: Path = Path("/proc/self/mountinfo")) -> Path | None:
    """Where the cgroup2 (unified) hierarchy is mounted, if it is."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        mount, _, fs = line.partition(" - ")
        fields = mount.split(" ")
        if fs.split(" ", 1)[0] == "cgroup2" and len(fields) > 4:
            return Path(fields[4])
    return None


def own_cgroup(proc_cgroup: Path = Path("/proc/self/cgroup")) -> str | None:
    """This process's cgroup in the unified hierarchy (``0::/path``), if it has one."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def locate(setting: str) -> Path | None:
    """The cgroup under which this executor makes its jobs' cgroups, from the setting:
    ``off``: none; ``auto``: its own cgroup in the mounted cgroup2 hierarchy, when it can make
    cgroups there, else none; a path: that cgroup2 directory, which must be writable
    (`CgroupError` otherwise)."""
    if setting == OFF:
        return None
    if setting != AUTO:
        base = Path(setting)
        if not (base / "cgroup.procs").is_file():
            raise CgroupError(f"job cgroups: {base} is not a cgroup2 directory")
        if not os.access(base, os.W_OK):
            raise CgroupError(f"job cgroups: {base} is not writable by this executor")
        return base
    mount, own = cgroup2_mount(), own_cgroup()
    if mount is None or own is None:
        return None
    base = mount / own.lstrip("/")
    if not (base / "cgroup.procs").is_file() or not os.access(base, os.W_OK):
        return None
    return base


class Freezer(Protocol):
    """Freezes a job whole, and thaws it (blocking calls: run them in a worker thread)."""

    def freeze(self) -> bool: ...

    def thaw(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class JobCgroup:
    path: Path

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(f"{pid}\n")

    def pids(self) -> list[int]:
        try:
            text = (self.path / "cgroup.procs").read_text()
        except FileNotFoundError:
            return []
        return [int(line) for line in text.split()]

    def populated(self) -> bool:
        try:
            events = (self.path / "cgroup.events").read_text()
        except FileNotFoundError:
            return False
        return "populated 1" in events

    def freeze(self, wait_s: float = _FREEZE_WAIT_S) -> bool:
        """Stop every process inside where it is (``cgroup.freeze``: none can leave or undo
        it); whether the kernel said all are frozen within `wait_s` (Linux 5.2 and later)."""
        return self._set_frozen(True, wait_s)

    def thaw(self, wait_s: float = _FREEZE_WAIT_S) -> bool:
        """Let the processes inside go on where they stopped; whether they did."""
        return self._set_frozen(False, wait_s)

    def frozen(self) -> bool:
        try:
            return "frozen 1" in (self.path / "cgroup.events").read_text()
        except FileNotFoundError:
            return False

    def _set_frozen(self, frozen: bool, wait_s: float) -> bool:
        try:
            (self.path / "cgroup.freeze").write_text("1\n" if frozen else "0\n")
        except OSError:
            return False  # gone, or a kernel without the freezer
        deadline = time.monotonic() + wait_s
        while self.frozen() != frozen:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def kill(self) -> None:
        """SIGKILL every process inside (``cgroup.kill``; one by one before Linux 5.14)."""
        try:
            (self.path / "cgroup.kill").write_text("1\n")
        except FileNotFoundError:
            if not self.path.exists():
                return
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def remove(self) -> bool:
        """Remove the cgroup once empty; False while a process is still inside."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True


def node_directory(node_id: str, work_dir: Path) -> Path:
    """``gfair-<node>-<place>``, relative to where job cgroups are made (`CgroupTree`)."""
    place = hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:12]
    return Path(f"gfair-{node_id}-{place}")


def tenant_directory(node_id: str, tenant: str, work_dir: Path) -> Path:
    """``gfair-<node>-<place>/<tenant>``, relative to where job cgroups are made (`CgroupTree`)."""
    return node_directory(node_id, work_dir) / tenant


def sweep_node(base: Path, node_id: str, work_dir: Path) -> list[int]:
    """Kill every job of every tenant of one node (its executor is gone: stopped, or killed
    before it could stop them) and remove their cgroups; the pids found."""
    node = base / node_directory(node_id, work_dir)
    try:
        tenants = [p for p in node.iterdir() if p.is_dir()]
    except OSError:
        return []
    found: list[int] = []
    for path in tenants:
        tree = CgroupTree(path)
        found += tree.sweep()
        tree.close()
    return found


@dataclass(frozen=True, slots=True)
class CgroupTree:
    """One tenant's job cgroups on one node: ``<base>/gfair-<node>-<place>/<tenant>/<job id>``,
    where ``<place>`` stands for the executor's work directory: two clusters on one host (two
    `gfair up`, a test beside a demo) may both have a node ``v100-0``, and one executor's
    sweep must never reach the other's jobs."""

    path: Path

    @classmethod
    def under(cls, base: Path, node_id: str, tenant: str, work_dir: Path) -> CgroupTree:
        path = base / tenant_directory(node_id, tenant, work_dir)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise CgroupError(f"job cgroups: cannot make {path}: {error}") from error
        return cls(path)

    def shown_as(self) -> str | None:
        """How ``/proc/<pid>/cgroup`` names this directory (``0::<it>``), if it can tell."""
        mount = cgroup2_mount()
        if mount is None or mount not in self.path.parents:
            return None
        return f"/{self.path.relative_to(mount)}"

    def job(self, job_id: str) -> JobCgroup:
        """A fresh cgroup for `job_id` (a leftover one is emptied and made anew)."""
        cgroup = JobCgroup(self.path / job_id)
        if cgroup.path.exists():
            empty(cgroup)
        with contextlib.suppress(FileExistsError):
            cgroup.path.mkdir()
        return cgroup

    def close(self) -> None:
        """Remove this tenant's directory, and the node's once no tenant has one, if empty."""
        for path in (self.path, self.path.parent):
            try:
                path.rmdir()
            except OSError:
                return  # still holds a job's cgroup (or another tenant's): kept

    def sweep(self) -> list[int]:
        """Kill what is left in this tenant's job cgroups (an earlier executor's, once their
        jobs were stopped at their checkpoints) and remove them; the pids found."""
        found: list[int] = []
        try:
            entries = [p for p in self.path.iterdir() if p.is_dir()]
        except FileNotFoundError:
            return found
        for path in entries:
            cgroup = JobCgroup(path)
            found += cgroup.pids()
            empty(cgroup)
        return found


def empty(cgroup: JobCgroup, wait_s: float = _KILL_WAIT_S) -> bool:
    """Kill everything in `cgroup` and remove it; False if a process outlived `wait_s`."""
    deadline = time.monotonic() + wait_s
    # A killed process leaves cgroup.procs as it dies, before it is a zombie to be reaped: an
    # empty cgroup can still have processes of ours on their way out, waited for here.
    seen: set[int] = set()
    removed = False
    while True:
        if not removed:
            seen.update(cgroup.pids())
            cgroup.kill()
        collect(seen)  # the executor is the subreaper of its jobs' orphans
        removed = removed or (not cgroup.populated() and cgroup.remove())
        if removed and not seen:
            return True
        if time.monotonic() > deadline:
            return removed
        time.sleep(0.01)
