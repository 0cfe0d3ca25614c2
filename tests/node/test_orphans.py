"""A node executor that died leaves its jobs running; the next one must stop them."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gfair.node.job_runner import SupervisorConfig
from gfair.node.launch import JobPaths, RunningJob
from gfair.node.orphans import RunEnd
from gfair.node.run_directory import EXIT_RECORD, TOLD_RECORD, RunDirectory
from gfair.node.supervisor import JobSupervisor
from gfair.sdk import YIELD_EXIT_CODE, JobEnvironment

from .helpers import SYNTHETIC, make_config, wait_for_text


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, 9)
        process.wait(timeout=10)


def spawn(argv: list[str], spawned: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(argv, start_new_session=True)
    spawned.append(process)
    return process


def launch_as_dead_executor(
    config: SupervisorConfig,
    job_id: str,
    argv: list[str],
    spawned: list[subprocess.Popen[bytes]],
    *,
    node_id: str = "node-a",
) -> tuple[RunDirectory, subprocess.Popen[bytes]]:
    """Start a job the way the supervisor does, then 'forget' it (its executor died)."""
    run = RunDirectory.create(config.run_root, job_id)
    env = JobEnvironment(
        job_id=job_id,
        attempt=1,
        checkpoint_dir=config.checkpoint_root / job_id,
        control_dir=run.control_dir,
        gpu_generation="v100",
        resume_checkpoint=None,
        managed=True,
    ).to_environ()
    process = subprocess.Popen(
        argv,
        env={**os.environ, **env},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    spawned.append(process)
    run.write_launch(
        {"node_id": node_id, "job_id": job_id, "attempt": 1, "pid": process.pid,
         "pgid": process.pid, "started_at": time.time()}
    )  # fmt: skip
    return run, process


async def test_restarted_executor_checkpoints_and_kills_its_predecessors_jobs(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    config = make_config(tmp_path)
    long_job = [*SYNTHETIC, "--iterations", "100000", "--speed-scale", "20"]
    orphan_run, orphan = launch_as_dead_executor(config, "orphan", long_job, spawned)
    _, foreign = launch_as_dead_executor(
        config, "foreign", ["sleep", "60"], spawned, node_id="node-b"
    )
    gone_run, gone = launch_as_dead_executor(config, "gone", ["true"], spawned)
    gone.wait(timeout=10)
    await wait_for_text(orphan_run.progress_file, '"kind":"step"')

    async with JobSupervisor(config) as supervisor:
        reaped = {r.job_id: r for r in supervisor.reaped}

    assert set(reaped) == {"orphan", "gone"}  # node-b's run is not ours to touch
    assert reaped["orphan"].found_alive
    assert orphan.wait(timeout=10) == YIELD_EXIT_CODE  # it was let checkpoint first
    checkpoint = reaped["orphan"].checkpoint
    assert checkpoint is not None and checkpoint.step > 0
    assert not reaped["gone"].found_alive and reaped["gone"].checkpoint is None
    assert foreign.poll() is None
    assert orphan_run.has_exited() and gone_run.has_exited()

    # Until their executor says the scheduler was told, a restart reports them again; after
    # that, never.
    async with JobSupervisor(config) as supervisor:
        again = {r.job_id: r for r in supervisor.reaped}
    assert set(again) == {"orphan", "gone"} and not again["orphan"].found_alive
    for run in again.values():
        run.told()
    async with JobSupervisor(config) as supervisor:
        assert supervisor.reaped == []


async def test_a_run_its_executor_saw_end_but_never_reported_is_found_with_its_end(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    config = make_config(tmp_path)
    ends = {
        "yielded": {"exit_code": YIELD_EXIT_CODE, "yielded": True, "terminated_by": None},
        "crashed": {"exit_code": 3, "signal": None, "yielded": False, "terminated_by": None},
        "killed": {"exit_code": None, "signal": 9, "yielded": False, "terminated_by": "kill"},
    }
    for job_id, end in ends.items():
        run, process = launch_as_dead_executor(config, job_id, ["true"], spawned)
        process.wait(timeout=10)
        run.stderr.write_text("Traceback ...\nValueError: bad batch\n")
        run.write_exit(end)  # its executor saw it end, and died before saying so

    async with JobSupervisor(config) as supervisor:
        found = {r.job_id: r for r in supervisor.reaped}

    assert {job: run.end for job, run in found.items()} == {
        "yielded": RunEnd.STOPPED,
        "crashed": RunEnd.EXITED,
        "killed": RunEnd.KILLED,
    }
    crashed = found["crashed"]
    assert crashed.exit_code == 3 and crashed.stderr_tail.endswith("ValueError: bad batch\n")
    assert crashed.started_at is not None and crashed.ended_at is not None
    assert found["killed"].signal == 9 and found["yielded"].stderr_tail == ""


async def test_a_recycled_pid_is_not_mistaken_for_an_orphan(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    config = make_config(tmp_path)
    # An unrelated process now holds the recorded process group id.
    stranger = spawn(["sleep", "60"], spawned)
    run = RunDirectory.create(config.run_root, "old")
    run.write_launch(
        {"node_id": "node-a", "job_id": "old", "attempt": 0, "pid": stranger.pid,
         "pgid": stranger.pid}
    )  # fmt: skip

    async with JobSupervisor(config) as supervisor:
        [reaped] = supervisor.reaped

    assert reaped.job_id == "old" and not reaped.found_alive
    assert stranger.poll() is None


async def test_a_run_whose_directory_went_is_marked_told_without_failing(tmp_path: Path) -> None:
    gone = tmp_path / "runs" / "x" / "run-0001"
    paths = JobPaths(gone, gone, gone / "control", gone / "o", gone / "e", tmp_path / "ckpt")
    handle = RunningJob("x", 1, 0, 0, (0,), "v100", 0.0, paths)
    async with JobSupervisor(make_config(tmp_path)) as supervisor:
        supervisor.told(handle)  # (an operator cleaned the runs up: the command goes on)
    assert not gone.exists()


async def test_an_exit_recorded_before_ends_were_marked_told_is_not_reported_again(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    config = make_config(tmp_path)
    run, process = launch_as_dead_executor(config, "legacy", ["true"], spawned)
    process.wait(timeout=10)
    # As an executor of an earlier version left every run it reported: no `told` field.
    (run.path / EXIT_RECORD).write_text(json.dumps({"exit_code": 0, "yielded": False}))

    async with JobSupervisor(config) as supervisor:
        assert supervisor.reaped == []
    assert (run.path / TOLD_RECORD).exists()  # settled once: no later restart reads it again
