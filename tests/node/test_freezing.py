"""A job still coming up when its slice ends is frozen in place (its cgroup's freezer), holding
no GPU, and goes on where it stopped at its next slice: a start-up longer than a slice is spread
over slices instead of begun again at each (docs/design.md §1.3). Only where the job has a
cgroup and its GPUs hold no memory of it; elsewhere it yields as before.

These run where the host has a writable cgroup2 hierarchy, as the project's machines have;
elsewhere they are skipped with that reason.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from gfair.node.job_cgroup import CgroupTree, JobCgroup
from gfair.node.launch import RunSpec
from gfair.node.process_group import process_exists
from gfair.node.supervisor import JobSupervisor
from support.waiting import consistently, eventually

from .conftest import needs_cgroups
from .helpers import JOB_PYTHON, make_config, wait_for_text

pytestmark = needs_cgroups

# Its start-up: CPU seconds of work (an import's), then it says it is up and ends.
STARTING_UP = (
    "import os, time\n"
    "while time.process_time() < float(os.environ['WORK_S']):\n"
    "    pass\n"
    "open(os.environ['GFAIR_CONTROL_DIR'] + '/up', 'w').write('up')\n"
)


# A job that never comes up and whose child leaves its process group (`setsid`) to go on
# working: writes the child's pid down, then both burn CPU.
ESCAPING = (
    "import os, subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', 'while True: pass'], start_new_session=True)\n"
    "open(os.environ['GFAIR_CONTROL_DIR'] + '/child', 'w').write(str(child.pid))\n"
    "while True:\n"
    "    pass\n"
)


def no_gpu_memory(indices: Sequence[int]) -> int:
    del indices
    return 0


def gpu_memory_held(indices: Sequence[int]) -> int:
    return len(indices)


def starting_up(job_id: str, work_s: float, gpu: int = 2) -> RunSpec:
    return RunSpec(
        job_id=job_id,
        argv=(JOB_PYTHON, "-c", STARTING_UP),
        gpu_indices=(gpu,),
        generation="v100",
        env={"WORK_S": str(work_s)},
    )


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


async def test_a_job_coming_up_is_frozen_holding_no_gpu_and_goes_on_where_it_stopped(
    tmp_path: Path, tree: CgroupTree
) -> None:
    config = make_config(tmp_path, cgroups=tree, gpu_processes=no_gpu_memory)
    async with JobSupervisor(config) as supervisor:
        job = await supervisor.start(starting_up("slow", work_s=1.5))
        await eventually(lambda: cpu_seconds(job.pid) > 0)  # some of its start-up done
        result = await supervisor.suspend("slow", timeout_s=5, enforce=True, park=True)
        assert result.parked and result.exited is None
        assert result.switch_s < 1.0  # no grace waited for: it had nothing to yield with
        assert supervisor.busy_gpus() == frozenset()
        (waiting,) = supervisor.parked()
        assert waiting.job_id == "slow" and waiting.rss_bytes > 0
        assert JobCgroup(tree.path / "slow").frozen()
        before = cpu_seconds(job.pid)
        # Frozen: its start-up does not go on.
        await consistently(lambda: cpu_seconds(job.pid) == before, 0.5)
        assert await supervisor.resume_in_place("slow", timeout_s=5) is not None
        assert supervisor.busy_gpus() == {2}
        exited = await supervisor.wait("slow")
    assert exited.exit_code == 0
    assert (job.paths.control_dir / "up").read_text() == "up"
    assert len(list((config.run_root / "slow").glob("run-*"))) == 1  # one process throughout


@pytest.mark.parametrize(
    ("gpu_processes", "cgroups"),
    [(gpu_memory_held, True), (None, True), (no_gpu_memory, False)],
    ids=["its GPUs hold memory", "the GPUs cannot tell", "no cgroup"],
)
async def test_a_job_coming_up_is_not_frozen_where_that_is_not_safe(
    tmp_path: Path,
    tree: CgroupTree,
    gpu_processes: object,
    cgroups: bool,
) -> None:
    config = make_config(tmp_path, cgroups=tree if cgroups else None, gpu_processes=gpu_processes)
    async with JobSupervisor(config) as supervisor:
        job = await supervisor.start(starting_up("slow", work_s=30))
        await eventually(lambda: cpu_seconds(job.pid) > 0)
        result = await supervisor.suspend("slow", timeout_s=0.5, enforce=True, park=True)
    # As before: it could not yield, and was forced off its GPUs once its grace was over.
    assert not result.parked and result.exited is not None
    assert result.escalation == "SIGKILL"


async def test_a_frozen_job_let_go_or_cancelled_ends_at_once(
    tmp_path: Path, tree: CgroupTree
) -> None:
    config = make_config(tmp_path, cgroups=tree, gpu_processes=no_gpu_memory)
    async with JobSupervisor(config) as supervisor:
        for gpu, job_id in enumerate(("moved", "cancelled")):
            job = await supervisor.start(starting_up(job_id, work_s=30, gpu=gpu))
            await eventually(lambda pid=job.pid: cpu_seconds(pid) > 0)
        for job_id in ("moved", "cancelled"):
            frozen = await supervisor.suspend(job_id, timeout_s=5, enforce=True, park=True)
            assert frozen.parked
        began = time.monotonic()
        # Wanted elsewhere: it has nothing to save, so it goes; and a cancel ends it too.
        moved = await supervisor.suspend("moved", timeout_s=5)
        cancelled = await supervisor.kill("cancelled", "cancelled")
        took = time.monotonic() - began
        assert supervisor.parked() == []
    assert moved.exited is not None and not moved.exited.completed
    assert moved.exited.exit_code is None and cancelled.exit_code is None  # killed
    assert took < 2 * config.term_grace_s  # no SIGTERM grace a frozen process cannot use
    assert not (tree.path / "moved").exists() and not (tree.path / "cancelled").exists()


async def test_a_frozen_job_s_process_that_left_its_group_is_frozen_too(
    tmp_path: Path, tree: CgroupTree
) -> None:
    """A tenant's way around a frozen process group: a child in a session of its own. The
    cgroup's freezer stops it as well, and nothing of the job runs until its next slice."""
    config = make_config(tmp_path, cgroups=tree, gpu_processes=no_gpu_memory)
    launch = RunSpec(
        job_id="escaping",
        argv=(JOB_PYTHON, "-c", ESCAPING),
        gpu_indices=(1,),
        generation="v100",
    )
    async with JobSupervisor(config) as supervisor:
        job = await supervisor.start(launch)
        child_file = job.paths.control_dir / "child"
        await wait_for_text(child_file, "")
        child = int(child_file.read_text())
        await eventually(lambda: cpu_seconds(child) > 0)
        assert (await supervisor.suspend("escaping", 5, enforce=True, park=True)).parked
        before = cpu_seconds(job.pid), cpu_seconds(child)
        await consistently(lambda: (cpu_seconds(job.pid), cpu_seconds(child)) == before, 0.5)
        await supervisor.kill("escaping", "cancelled")
    assert not process_exists(child)  # it went with the job
