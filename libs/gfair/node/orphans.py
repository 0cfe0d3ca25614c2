"""Runs an executor that died left untold: find them, let the live ones checkpoint, kill them.

If a node executor is killed (OOM killer, SIGKILL, crash), its jobs keep running in their own
sessions. The scheduler will re-place those jobs, so the restarted executor must stop them, or
one job would run twice and hold GPUs the scheduler believes free. A run is ours when its
`launch.json` names this node and a live process of its recorded process group carries the run's
own control directory in its environment (so a recycled process id is never mistaken for it).
Linux only (/proc); elsewhere nothing is found.

A run whose end the dead executor saw but never reported (it died between the two) is found
too, with how it ended: the restarted executor reports it before any command, so the record
never shows the job on GPUs that later runs took.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from gfair.node.launch import CheckpointRef
from gfair.node.process_group import group_members, read_tail, signal_group
from gfair.node.run_directory import EXIT_RECORD, RunDirectory
from gfair.sdk.checkpoint import CheckpointStore
from gfair.sdk.environment import ENV_CONTROL_DIR

_PROC = Path("/proc")
_KILL_WAIT_S = 5.0
_POLL_S = 0.05


class RunEnd(StrEnum):
    """How a reaped run ended, so what the scheduler is to be told."""

    STOPPED = "stopped"  # it yielded, was stopped here, or vanished: it is off its GPUs
    EXITED = "exited"  # on its own (done, or failed): its exit is to be classified
    KILLED = "killed"  # by a kill, which is reported by no one


@dataclass(frozen=True, slots=True)
class ReapedRun:
    """A run an earlier executor of this node never told the scheduler the end of.

    `found_alive` says whether its processes were still running (then they were asked to yield,
    and killed after the grace period). `checkpoint` is where the job can resume from. For an
    end its executor saw (`exit_code`, `signal`, `stderr_tail`, `ended_at`), `end` says how.
    """

    job_id: str
    attempt: int
    run_dir: Path
    pgid: int
    found_alive: bool
    checkpoint: CheckpointRef | None
    end: RunEnd = RunEnd.STOPPED
    exit_code: int | None = None
    signal: int | None = None
    stderr_tail: str = ""
    started_at: float | None = None
    ended_at: float | None = None

    @property
    def ran_s(self) -> float:
        if self.started_at is None or self.ended_at is None:
            return 0.0
        return max(0.0, self.ended_at - self.started_at)

    def told(self) -> None:
        """The scheduler was told (or needs no telling): the next restart passes it over."""
        RunDirectory(self.run_dir).mark_told()


async def reap_orphans(
    run_root: Path, *, node_id: str, checkpoint_root: Path, grace_s: float, tail_bytes: int
) -> list[ReapedRun]:
    reaped = []
    for run in RunDirectory.untold(run_root):
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
        ended = run.exit_record()
        if ended is not None and not ended.get("reaped"):
            reaped.append(_ended(run, record, ended, alive, checkpoint, tail_bytes))
            continue
        if ended is None:
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


def _ended(
    run: RunDirectory,
    launch: dict[str, Any],
    ended: dict[str, Any],
    alive: bool,
    checkpoint: CheckpointRef | None,
    tail_bytes: int,
) -> ReapedRun:
    """A run whose end its executor recorded (`ended`: the supervisor's exit record) and died
    before reporting."""
    if ended.get("yielded"):
        end = RunEnd.STOPPED
    elif ended.get("terminated_by") is not None:
        end = RunEnd.KILLED
    else:
        end = RunEnd.EXITED
    exit_code, signum = ended.get("exit_code"), ended.get("signal")
    return ReapedRun(
        job_id=str(launch["job_id"]),
        attempt=int(launch.get("attempt", 0)),
        run_dir=run.path,
        pgid=int(launch["pgid"]),
        found_alive=alive,  # (what its group left behind: the run itself had ended)
        checkpoint=checkpoint,
        end=end,
        exit_code=exit_code if isinstance(exit_code, int) else None,
        signal=signum if isinstance(signum, int) else None,
        stderr_tail=read_tail(run.stderr, tail_bytes) if end is RunEnd.EXITED else "",
        started_at=_seconds(launch.get("started_at")),
        ended_at=_modified(run.path / EXIT_RECORD),
    )


def _seconds(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _modified(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


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
