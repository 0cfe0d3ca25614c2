"""Jobs left running by an executor that died: find them, let them checkpoint, kill them.

If a node executor is killed (OOM killer, SIGKILL, crash), its jobs keep running in their own
sessions. The scheduler will re-place those jobs, so the restarted executor must stop them, or
one job would run twice and hold GPUs the scheduler believes free. A run is ours when its
`launch.json` names this node and a live process of its recorded process group carries the run's
own control directory in its environment (so a recycled process id is never mistaken for it).
Linux only (/proc); elsewhere nothing is found.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread

from gfair.node.launch import CheckpointRef
from gfair.node.process_group import group_members, signal_group
from gfair.node.run_directory import RunDirectory
from gfair.sdk.checkpoint import CheckpointStore
from gfair.sdk.environment import ENV_CONTROL_DIR

_PROC = Path("/proc")
_KILL_WAIT_S = 5.0
_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class ReapedRun:
    """A run an earlier executor of this node never saw end.

    `found_alive` says whether its processes were still running (then they were asked to yield,
    and killed after the grace period). `checkpoint` is where the job can resume from.
    """

    job_id: str
    attempt: int
    run_dir: Path
    pgid: int
    found_alive: bool
    checkpoint: CheckpointRef | None


async def reap_orphans(
    run_root: Path, *, node_id: str, checkpoint_root: Path, grace_s: float
) -> list[ReapedRun]:
    reaped = []
    for run in RunDirectory.unfinished(run_root):
        record = run.launch_record()
        if record is None or record.get("node_id") != node_id:
            continue
        job_id, pgid = str(record["job_id"]), int(record["pgid"])
        marker = f"{ENV_CONTROL_DIR}={run.control_dir}".encode()
        alive = bool(await anyio.to_thread.run_sync(_members_with, pgid, marker))
        if alive:
            run.request_yield()
            with anyio.move_on_after(grace_s):
                # Polled: these processes are not our children, so there is nothing to wait on.
                while True:
                    if not await anyio.to_thread.run_sync(_members_with, pgid, marker):
                        break
                    await anyio.sleep(_POLL_S)
            with anyio.move_on_after(_KILL_WAIT_S):
                while await anyio.to_thread.run_sync(_members_with, pgid, marker):
                    signal_group(pgid, signal.SIGKILL)
                    await anyio.sleep(_POLL_S)
        latest = CheckpointStore(checkpoint_root / job_id).latest()
        checkpoint = CheckpointRef.of(latest) if latest is not None else None
        run.write_exit({"reaped": True, "found_alive": alive})
        reaped.append(
            ReapedRun(
                job_id=job_id,
                attempt=int(record.get("attempt", 0)),
                run_dir=run.path,
                pgid=pgid,
                found_alive=alive,
                checkpoint=checkpoint,
            )
        )
    return reaped


def _members_with(pgid: int, marker: bytes) -> list[int]:
    """Live (non-zombie) processes of group `pgid` whose environment contains `marker`."""
    found = []
    for member in group_members(pgid):
        if member.zombie:
            continue
        try:
            environ = (_PROC / str(member.pid) / "environ").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if marker in environ.split(b"\0"):
            found.append(member.pid)
    return found
