"""Job processes the executors left behind: found through their cgroups and their marker."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from gfair.node.job_cgroup import AUTO, CgroupError, locate, node_directory, sweep_node
from gfair.node.job_limits import kill_legacy, v1_hierarchies
from gfair.sdk.environment import ENV_CONTROL_DIR

_log = structlog.get_logger("gfair.embedded_cluster")


def kill_marked(work_roots: Sequence[Path]) -> int:
    """SIGKILL every process carrying the control-directory marker of an executor whose work
    root is one of `work_roots` (one pass over /proc); how many."""
    markers = tuple(f"{ENV_CONTROL_DIR}={root}/".encode() for root in work_roots)
    killed = 0
    for pid in _pids_with_environ(markers):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


def stop_jobs(work_roots: Mapping[str, Path], env: Mapping[str, str]) -> int:
    """Kill every job the executors (node id -> work root) left: one that ignored its drain
    past the stop grace (its executor was killed before it could), and whatever such a job
    started. Through the jobs' cgroups (v2, then the v1 ones of their limits, as
    ``GFAIR_JOB_CGROUPS`` of `env` places them), then their marker; how many were found."""
    setting = env.get("GFAIR_JOB_CGROUPS", AUTO).strip() or AUTO
    try:
        base = locate(setting)
    except CgroupError:
        base = None
    legacy = v1_hierarchies()
    found = 0
    for node_id, work_root in work_roots.items():
        if base is not None:
            found += len(sweep_node(base, node_id, work_root))
        for hierarchy in set(legacy.values()):
            found += len(kill_legacy(hierarchy / node_directory(node_id, work_root)))
    found += kill_marked(tuple(work_roots.values()))
    if found:
        _log.warning("killed jobs their executors left running", processes=found)
    return found


def _pids_with_environ(markers: tuple[bytes, ...]) -> list[int]:
    """Processes whose environment holds one of `markers` (``NAME=value`` prefixes); Linux
    only."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if any(item.startswith(markers) for item in environ.split(b"\0")):
            found.append(int(entry.name))
    return found
