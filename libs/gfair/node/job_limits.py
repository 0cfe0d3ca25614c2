"""Memory and CPU limits per job, in proportion to its GPUs (issue 11, item 4).

An operator sets what one GPU's share of a node is (``GFAIR_JOB_MEMORY_PER_GPU``, e.g.
``16G``, and ``GFAIR_JOB_CPUS_PER_GPU``, e.g. ``6``); a job on k GPUs of the node gets k times
that, so one tenant's job cannot starve the others' data loaders or push the node into swap.
The kernel enforces them: over its memory limit a job is killed by the OOM killer (and the
failure detector is told so, as out-of-memory, not as a node fault); over its CPU time it is
throttled. A process-count limit (``GFAIR_JOB_PIDS_MAX``, per job whatever its GPUs) stops a
fork bomb at that many processes and threads: its next fork fails with EAGAIN.

Where the limits are written, per controller:

- **cgroup v2**, when the job cgroups of `gfair.node.job_cgroup` exist and the controller can be
  enabled down to them: ``memory.max`` (with ``memory.swap.max`` 0: a limit swap could take the
  place of is none) and ``cpu.max`` in the job's own cgroup. Enabling a controller for a
  cgroup's children needs that cgroup to hold no process of its own (the "no internal
  processes" rule), so an executor that runs in the cgroup its jobs go under (``auto`` in a
  container) must be given a delegated directory of its own (``GFAIR_JOB_CGROUPS``).
- **cgroup v1**, where the controller is bound to a v1 hierarchy instead (hosts on the legacy
  or hybrid layout, as the project's CI machines are): the same ``gfair-<node>-<place>/<tenant>
  /<job>`` layout under the executor's own cgroup of that hierarchy, ``memory.limit_in_bytes``
  (and ``memory.memsw.limit_in_bytes`` where swap is accounted), ``cpu.cfs_quota_us`` and
  ``pids.max``. A job's v1 cgroups list its processes too: where there is no v2 job cgroup to
  kill, `JobLimitGroups.kill` finds through them a process that left the job's session and
  cleared its environment.

**Devices** (``JobLimits.devices``): a job's cgroup denies every device node but the few any
process needs and its own GPUs' (`device_rules`), so a job that unsets ``CUDA_VISIBLE_DEVICES``
still opens no other GPU of its node: through an eBPF program on its v2 cgroup
(`gfair.node.device_program`) where the host lets the executor load one, else through its v1
``devices`` cgroup.

A limit that was asked for and that the host cannot enforce stops the executor at start with
the reason (`check_host`, from its settings): silently running unlimited jobs is not what an
operator who set one expects.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gfair.node import device_program
from gfair.node.job_cgroup import CgroupTree, JobCgroup, cgroup2_mount
from gfair.node.process_group import collect

MEMORY = "memory"
CPU = "cpu"
PIDS = "pids"
DEVICES = "devices"
CPU_PERIOD_US = 100_000
# Swap limits, absent where swap is not accounted: then the memory limit is the limit.
_OPTIONAL = frozenset({"memory.swap.max", "memory.memsw.limit_in_bytes"})

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class LimitError(RuntimeError):
    """A limit was asked for that this host cannot enforce, or its value is not one."""


def parse_size(text: str) -> int:
    """Bytes from ``"512M"``, ``"16G"``, ``"1.5GiB"`` or a plain number of bytes."""
    found = _SIZE.match(text)
    if found is None:
        raise LimitError(f"{text!r} is not a size (such as 512M, 16G or 1.5GiB)")
    value = int(float(found.group(1)) * _UNITS[found.group(2).lower()])
    if value < 1 << 20:
        raise LimitError(f"{text!r}: a job needs at least 1M of memory")
    return value


@dataclass(frozen=True, slots=True)
class JobLimits:
    """One GPU's share of a node; None: no limit of that kind."""

    memory_per_gpu: int | None = None  # bytes
    cpus_per_gpu: float | None = None
    pids_max: int | None = None  # processes and threads of one job, whatever its GPUs
    devices: bool = False  # only its own GPUs' device nodes (`device_rules`)

    def __post_init__(self) -> None:
        if self.pids_max is not None and self.pids_max < 1:
            raise LimitError(f"a job's process limit must be at least 1, got {self.pids_max}")
        cpus = self.cpus_per_gpu
        if cpus is not None and not (math.isfinite(cpus) and cpus > 0):
            raise LimitError(f"CPUs per GPU must be a positive number, got {cpus!r}")

    @property
    def controllers(self) -> tuple[str, ...]:
        wanted = ((MEMORY, self.memory_per_gpu), (CPU, self.cpus_per_gpu), (PIDS, self.pids_max))
        found = tuple(name for name, value in wanted if value is not None)
        return (*found, DEVICES) if self.devices else found

    def values(self, gpus: int, unified: bool) -> dict[str, dict[str, str]]:
        """controller -> interface file -> value, for a job on `gpus` GPUs of this node (at
        least one GPU's worth: a job on no GPU still runs code)."""
        share = max(gpus, 1)
        out: dict[str, dict[str, str]] = {}
        if self.memory_per_gpu is not None:
            memory = str(self.memory_per_gpu * share)
            if unified:
                out[MEMORY] = {"memory.max": memory, "memory.swap.max": "0"}
            else:  # memsw: memory and swap together, where swap is accounted at all
                out[MEMORY] = {
                    "memory.limit_in_bytes": memory,
                    "memory.memsw.limit_in_bytes": memory,
                }
        if self.cpus_per_gpu is not None:
            quota = max(int(self.cpus_per_gpu * share * CPU_PERIOD_US), 1000)
            if unified:
                out[CPU] = {"cpu.max": f"{quota} {CPU_PERIOD_US}"}
            else:
                out[CPU] = {"cpu.cfs_period_us": str(CPU_PERIOD_US), "cpu.cfs_quota_us": str(quota)}
        if self.pids_max is not None:
            out[PIDS] = {"pids.max": str(self.pids_max)}  # the same file in v1 and v2
        return out


def check_host(limits: JobLimits, cgroup_base: Path | None) -> None:
    """Raise `LimitError` unless every limit asked for has a controller on this host: one the
    job cgroups under `cgroup_base` (cgroup2) can be given, or a v1 hierarchy."""
    legacy = v1_hierarchies()
    for controller in limits.controllers:
        unified = cgroup_base is not None and _offered(
            cgroup_base / "cgroup.controllers", controller
        )
        # A v1 hierarchy serves only where the executor may make its jobs' cgroups in it.
        usable = controller in legacy and os.access(legacy[controller], os.W_OK)
        if not unified and not usable:
            raise LimitError(_no_controller(controller))


def _no_controller(controller: str) -> str:
    return (
        f"job {controller} limits: this host gives the executor no {controller} controller "
        "(neither one its cgroup2 job cgroups can have nor a cgroup v1 hierarchy); give it a "
        "delegated cgroup2 directory (GFAIR_JOB_CGROUPS) or leave the limit unset"
    )


def v1_hierarchies(
    mountinfo: Path = Path("/proc/self/mountinfo"), proc_cgroup: Path = Path("/proc/self/cgroup")
) -> dict[str, Path]:
    """controller -> this process's own cgroup directory in the v1 hierarchy that controller is
    bound to (only controllers bound to a mounted v1 hierarchy)."""
    own: dict[str, str] = {}
    try:
        for line in proc_cgroup.read_text().splitlines():
            _, controllers, cgroup = line.split(":", 2)
            for controller in controllers.split(","):
                if controller:
                    own[controller] = cgroup
        lines = mountinfo.read_text().splitlines()
    except (OSError, ValueError):
        return {}
    found: dict[str, Path] = {}
    for line in lines:
        mount, _, fs = line.partition(" - ")
        fields, fs_fields = mount.split(" "), fs.split(" ")
        if fs_fields[0] != "cgroup" or len(fields) < 5 or len(fs_fields) < 3:
            continue
        root, point = fields[3], Path(fields[4])
        for controller in fs_fields[2].split(","):
            path = own.get(controller)
            if path is None or controller in found:
                continue
            # The mount shows the hierarchy from `root` down; our cgroup is below it.
            relative = Path(path).relative_to(root) if path.startswith(root) else Path(path)
            found[controller] = point / str(relative).lstrip("/")
    return found


@dataclass(frozen=True, slots=True)
class JobLimitGroups:
    """One job's limited cgroups: its own v2 cgroup (limits written into it) and/or v1 ones."""

    unified: JobCgroup | None
    legacy: Mapping[str, Path]  # controller -> the job's v1 cgroup
    memory: int | None  # its memory limit, bytes

    devices: bool = False  # whether `unified` holds its device program

    def allow_devices(self, rules: Sequence[str]) -> None:
        """Let the job open only the device nodes `rules` allow (where its devices are limited:
        a job moved to other GPUs)."""
        if self.devices and self.unified is not None:
            _program(self.unified.path, rules)
        path = self.legacy.get(DEVICES)
        if path is not None:
            _allow_only(path, rules)

    def oom_kills(self) -> int:
        """How many of the job's processes the OOM killer took for its memory limit."""
        if self.unified is not None and (self.unified.path / "memory.max").exists():
            return _oom_count(self.unified.path / "memory.events")
        path = self.legacy.get(MEMORY)
        return 0 if path is None else _oom_count(path / "memory.oom_control")

    def pids(self) -> set[int]:
        """The processes in the job's v1 cgroups."""
        found: set[int] = set()
        for path in self.legacy.values():
            found.update(_procs(path))
        return found

    def kill(self, wait_s: float = 2.0) -> bool:
        """SIGKILL every process in the job's v1 cgroups until they are empty (v1 has no
        ``cgroup.kill``: a fork between listing and killing is caught by the next round, and the
        process limit bounds the rounds); False if one outlived `wait_s`."""
        deadline = time.monotonic() + wait_s
        seen: set[int] = set()
        while True:
            pids = self.pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            seen |= pids
            collect(seen)  # the executor is the subreaper of orphans
            if not seen:  # (it holds every pid listed)
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)

    def remove(self) -> None:
        """Remove the v1 cgroups (once the job's processes are gone; kept while one is in)."""
        for path in self.legacy.values():
            with contextlib.suppress(OSError):
                path.rmdir()


def _procs(path: Path) -> list[int]:
    try:
        return [int(line) for line in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def kill_legacy(base: Path, wait_s: float = 5.0) -> list[int]:
    """Kill every process in the v1 cgroups under `base` (a node's or tenant's directory, at
    any depth) and remove them; the pids found."""
    if not base.is_dir():
        return []
    groups = sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
    found: set[int] = set()
    for path in [*groups, base]:
        job = JobLimitGroups(None, {"v1": path}, None)
        found |= job.pids()
        job.kill(wait_s)
        with contextlib.suppress(OSError):
            path.rmdir()
    return sorted(found)


def _oom_count(counters: Path) -> int:
    try:
        text = counters.read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill":
            return int(value)
    return 0


@dataclass(frozen=True, slots=True)
class LimitTree:
    """Where one tenant's jobs on one node get their limits (module doc)."""

    limits: JobLimits
    unified: tuple[str, ...]  # controllers set in the v2 job cgroups
    legacy: Mapping[str, Path]  # controller -> the tenant's v1 directory

    @classmethod
    def under(
        cls,
        limits: JobLimits,
        tree: CgroupTree | None,
        legacy_base: Mapping[str, Path],
        relative: Path,
    ) -> LimitTree:
        """Limits for the jobs of `tree` (the tenant's v2 job cgroups, if any): each controller
        through v2 where it can be enabled there, else through its v1 hierarchy at
        ``legacy_base[controller] / relative``; `LimitError` where neither can."""
        unified = _enable(tree, limits.controllers) if tree is not None else ()
        if limits.devices and tree is not None and device_program.available():
            unified = (*unified, DEVICES)  # no controller to enable: a program per job cgroup
        legacy: dict[str, Path] = {}
        for controller in limits.controllers:
            if controller in unified:
                continue
            base = legacy_base.get(controller)
            if base is None:
                raise LimitError(_no_controller(controller))
            path = base / relative
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise LimitError(f"job {controller} limits: cannot make {path}: {error}") from error
            legacy[controller] = path
        return cls(limits, unified, legacy)

    def job(
        self, job_id: str, gpus: int, cgroup: JobCgroup | None, devices: Sequence[str] = ()
    ) -> JobLimitGroups:
        """The limited cgroups of a job on `gpus` GPUs; `cgroup` is its v2 one (made by
        `CgroupTree.job`), which must exist where any controller goes through v2; `devices`
        the ``devices.allow`` rules of its devices cgroup (`device_rules`)."""
        made: dict[str, Path] = {}
        if self.unified:
            assert cgroup is not None
            _write(cgroup.path, self.limits.values(gpus, unified=True), self.unified)
            if DEVICES in self.unified:
                _program(cgroup.path, devices)
        values = self.limits.values(gpus, unified=False)
        for controller, base in self.legacy.items():
            path = base / job_id
            # Made anew: a leftover's limits (an earlier setting) could refuse the new ones.
            with contextlib.suppress(OSError):
                path.rmdir()
            with contextlib.suppress(FileExistsError):
                path.mkdir()
            made[controller] = path
            _write(path, values, (controller,))
            if controller == DEVICES:
                _allow_only(path, devices)
        per_gpu = self.limits.memory_per_gpu
        memory = None if per_gpu is None else per_gpu * max(gpus, 1)
        return JobLimitGroups(
            cgroup if self.unified else None, made, memory, devices=DEVICES in self.unified
        )

    def sweep(self) -> None:
        """Kill what is left in v1 job cgroups an earlier executor left (a process that left
        its job's session and cleared its environment, where no v2 cgroup held it) and remove
        them."""
        for base in self.legacy.values():
            with contextlib.suppress(OSError):
                for path in base.iterdir():
                    if path.is_dir():
                        JobLimitGroups(None, {"v1": path}, None).kill()
                        with contextlib.suppress(OSError):
                            path.rmdir()

    def close(self) -> None:
        for base in self.legacy.values():
            for path in (base, base.parent):
                try:
                    path.rmdir()
                except OSError:
                    break


# What any process may need, by (major, minor) as the kernel numbers them: null, zero, full,
# random, urandom, tty, ptmx and the pseudo-terminals.
_STANDARD_DEVICES = ("1:3", "1:5", "1:7", "1:8", "1:9", "5:0", "5:2", "136:*")
# NVIDIA's devices every CUDA process opens, whatever its GPUs (where the driver made them).
_NVIDIA_SHARED = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


def device_rules(gpu_nodes: Iterable[Path], dev: Path = Path("/dev")) -> list[str]:
    """``devices.allow`` rules for a job that holds the GPUs whose device nodes these are."""
    rules = [f"c {number} rwm" for number in _STANDARD_DEVICES]
    shared = [dev / name for name in _NVIDIA_SHARED]
    for node in [*gpu_nodes, *(p for p in shared if p.exists())]:
        found = node.stat()
        if not stat.S_ISCHR(found.st_mode):
            raise LimitError(f"{node} is not a character device")
        rules.append(f"c {os.major(found.st_rdev)}:{os.minor(found.st_rdev)} rwm")
    return rules


def _program(cgroup: Path, rules: Sequence[str]) -> None:
    try:
        device_program.allow_only(cgroup, rules)
    except device_program.DeviceProgramError as error:
        raise LimitError(str(error)) from error


def _allow_only(path: Path, rules: Sequence[str]) -> None:
    # Denied all first; the kernel takes one rule per write.
    for name, rule in [("devices.deny", "a"), *(("devices.allow", r) for r in rules)]:
        try:
            (path / name).write_text(rule)
        except OSError as error:
            raise LimitError(f"cannot write {rule!r} to {path / name}: {error}") from error


def _write(path: Path, values: Mapping[str, Mapping[str, str]], controllers: Iterable[str]) -> None:
    for controller in controllers:
        for name, value in values.get(controller, {}).items():
            target = path / name
            if name in _OPTIONAL and not target.exists():
                continue
            try:
                target.write_text(value)
            except OSError as error:
                raise LimitError(f"cannot set {name}={value} in {path}: {error}") from error


def _enable(tree: CgroupTree, controllers: tuple[str, ...]) -> tuple[str, ...]:
    """The `controllers` that the v2 job cgroups under `tree` can have, enabling them down the
    chain from the cgroup2 mount's first cgroup that offers them."""
    mount = cgroup2_mount()
    if mount is None:
        return ()
    chain = [tree.path, *tree.path.parents]
    chain = [p for p in chain if p == mount or mount in p.parents]
    chain.reverse()  # from the mount down to the tenant's directory
    enabled: list[str] = []
    for controller in controllers:
        for parent in chain[:-1]:
            if _offered(parent / "cgroup.subtree_control", controller):
                continue
            if not _offered(parent / "cgroup.controllers", controller):
                break
            try:
                (parent / "cgroup.subtree_control").write_text(f"+{controller}")
            except OSError:
                break  # processes of its own (no internal processes), or not ours to change
        if _offered(chain[-1] / "cgroup.controllers", controller):
            enabled.append(controller)
    return tuple(enabled)


def _offered(path: Path, controller: str) -> bool:
    try:
        return controller in path.read_text().split()
    except OSError:
        return False
