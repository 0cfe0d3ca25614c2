"""Jobs parked in place by the supervisor: resumed in the same process, or checkpointed and gone."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gfair.node.job_cgroup import CgroupTree, JobCgroup
from gfair.node.launch import RunSpec
from gfair.node.lifecycle import ProgressReport
from gfair.node.supervisor import JobSupervisor
from gfair.sdk.checkpoint import CheckpointStore
from gfair.sdk.environment import PARKED_MARKER

from .conftest import needs_cgroups
from .helpers import JOB_PYTHON, EventLog, make_config, wait_for_text

PARKING_JOB = str(Path(__file__).with_name("parking_job.py"))


def parking(job_id: str, steps: int, pause_s: float = 0.005) -> RunSpec:
    return RunSpec(
        job_id=job_id,
        argv=(JOB_PYTHON, PARKING_JOB, str(steps), str(pause_s)),
        gpu_indices=(1,),
        generation="v100",
    )


def final_state(checkpoints: Path) -> dict[str, int]:
    latest = CheckpointStore(checkpoints).latest()
    assert latest is not None
    return {k: int(v) for k, v in latest.state.items()}


async def test_a_parked_job_frees_its_gpus_and_resumes_in_the_same_process(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path)
    async with JobSupervisor(config) as supervisor:
        log = EventLog(supervisor.events)
        job = await supervisor.start(parking("job-p", 400))
        await log.first(ProgressReport, lambda p: p.steps >= 20)
        for _ in range(3):
            parked = await supervisor.suspend("job-p", timeout_s=10, park=True)
            assert parked.parked and parked.exited is None
            assert supervisor.busy_gpus() == frozenset()  # parked: holds no GPU
            (info,) = supervisor.parked()
            assert info.job_id == "job-p" and info.rss_bytes > 0
            assert (job.paths.checkpoint_dir / PARKED_MARKER).exists()
            took = await supervisor.resume_in_place("job-p", timeout_s=10)
            assert took is not None
            assert supervisor.busy_gpus() == {1}
            assert not (job.paths.checkpoint_dir / PARKED_MARKER).exists()
        exited = await supervisor.wait("job-p")
    assert exited.completed and exited.steps == 400
    # One process throughout: its state went to the host and back three times.
    assert final_state(job.paths.checkpoint_dir) == {"step": 400, "offloads": 3, "restores": 3}
    runs = list((config.run_root / "job-p").glob("run-*"))
    assert len(runs) == 1


@needs_cgroups
async def test_a_parked_job_is_frozen_until_answered_and_resumes_or_leaves(
    tmp_path: Path, tree: CgroupTree
) -> None:
    # The node checks a park (tests/security/test_park.py): the SDK's own parks still work.
    config = make_config(tmp_path, cgroups=tree)
    async with JobSupervisor(config) as supervisor:
        log = EventLog(supervisor.events)
        job = await supervisor.start(parking("job-f", 100_000))
        await log.first(ProgressReport, lambda p: p.steps >= 20)
        for _ in range(2):
            assert (await supervisor.suspend("job-f", timeout_s=10, park=True)).parked
            assert JobCgroup(tree.path / "job-f").frozen()
            assert await supervisor.resume_in_place("job-f", timeout_s=10) is not None
            assert not JobCgroup(tree.path / "job-f").frozen()
        assert (await supervisor.suspend("job-f", timeout_s=10, park=True)).parked
        left = await supervisor.suspend("job-f", timeout_s=10)
    assert left.fresh and left.exit.yielded and left.escalation is None
    assert final_state(job.paths.checkpoint_dir)["offloads"] == 3


async def test_a_parked_job_told_to_leave_checkpoints_where_it_parked(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    async with JobSupervisor(config) as supervisor:
        log = EventLog(supervisor.events)
        job = await supervisor.start(parking("job-q", 100_000))
        await log.first(ProgressReport, lambda p: p.steps >= 20)
        parked = await supervisor.suspend("job-q", timeout_s=10, park=True)
        assert parked.parked
        records = (job.paths.control_dir / "progress.jsonl").read_text().splitlines()
        parked_at = [json.loads(r)["step"] for r in records if '"parked"' in r][-1]
        left = await supervisor.suspend("job-q", timeout_s=10)
    assert not left.parked and left.fresh and left.exit.yielded
    assert left.checkpoint is not None and left.checkpoint.step == parked_at
    # It left while parked: its state went to the host, never came back, and is what it saved.
    assert final_state(job.paths.checkpoint_dir) == {
        "step": parked_at,
        "offloads": 1,
        "restores": 0,
    }
    assert not (job.paths.checkpoint_dir / PARKED_MARKER).exists()


async def test_killing_a_parked_job_ends_it_and_clears_its_marker(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    async with JobSupervisor(config) as supervisor:
        job = await supervisor.start(parking("job-k", 100_000))
        await wait_for_text(job.paths.control_dir / "progress.jsonl", '"kind":"step"')
        assert (await supervisor.suspend("job-k", timeout_s=10, park=True)).parked
        exited = await supervisor.kill("job-k", "cancelled")
        assert supervisor.parked() == []
    assert not exited.completed and exited.terminated_by is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(job.pgid, 0)
    assert not (job.paths.checkpoint_dir / PARKED_MARKER).exists()


async def test_a_job_that_cannot_park_exits_for_its_yield_as_before(tmp_path: Path) -> None:
    # Parking not allowed (a move, a drain): the same loop checkpoints and exits.
    config = make_config(tmp_path)
    async with JobSupervisor(config) as supervisor:
        log = EventLog(supervisor.events)
        job = await supervisor.start(parking("job-x", 100_000))
        await log.first(ProgressReport, lambda p: p.steps >= 20)
        result = await supervisor.suspend("job-x", timeout_s=10)
    assert not result.parked and result.fresh
    assert result.exit.yielded
    assert final_state(job.paths.checkpoint_dir)["offloads"] == 0
