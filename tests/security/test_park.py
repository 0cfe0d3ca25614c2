"""A tenant's job that says it parked and goes on computing (issue 41, item 4): asked to park,
it writes `{"kind":"parked"}` and keeps its GPUs' work going. The node does not take its word:
the parked job's cgroup is frozen, and a job that writes anything after saying it parked, before
the node answered, is killed and its suspend reported as forced (charged as a job that ignored
its yield)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gfair.node.job_cgroup import AUTO, CgroupTree, locate
from gfair.node.launch import RunSpec
from gfair.node.supervisor import JobSupervisor
from node.helpers import (
    JOB_PYTHON,
    make_config,
    reachable_tmp,
    sdk_on_pythonpath,
    synthetic,
    wait_for_text,
)
from support.waiting import consistently

tmp_path = pytest.fixture(name="tmp_path")(reachable_tmp)
sdk_for_jobs = pytest.fixture(autouse=True)(sdk_on_pythonpath)

# Trains (step records through the SDK); once asked to yield it writes the parked record the
# SDK would, then goes on: writing a step record right after it (STEPS=1), or silently burning
# CPU (STEPS=0), as a job keeping its GPUs busy would.
LIAR = (
    "import json, os, time\n"
    "from gfair.sdk import Job\n"
    "job = Job.from_env()\n"
    "progress = os.path.join(os.environ['GFAIR_CONTROL_DIR'], 'progress.jsonl')\n"
    "step = 0\n"
    "while not job.should_yield():\n"
    "    time.sleep(0.01)\n"
    "    job.report(step)\n"
    "    step += 1\n"
    "with open(progress, 'a') as out:\n"
    "    out.write(json.dumps({'kind': 'parked', 'time': time.time(), 'step': step, 'park': 1})"
    " + '\\n')\n"
    "    if os.environ['STEPS'] == '1':\n"
    "        out.write(json.dumps({'kind': 'step', 'time': time.time(), 'step': step + 1})"
    " + '\\n')\n"
    "    out.flush()\n"
    "    while True:\n"
    "        step += 1\n"
    "        if os.environ['STEPS'] == '1' and step % 100_000 == 0:\n"
    "            out.write(json.dumps({'kind': 'step', 'time': time.time(), 'step': step})"
    " + '\\n')\n"
    "            out.flush()\n"
)


def _liar(job_id: str, *, steps: bool) -> RunSpec:
    return dataclasses.replace(
        synthetic(job_id, (0,), "v100"),
        argv=(JOB_PYTHON, "-c", LIAR),
        env={"STEPS": "1" if steps else "0"},
    )


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


async def test_a_job_that_steps_after_saying_it_parked_is_killed_and_charged(
    tmp_path: Path,
) -> None:
    base = locate(AUTO)
    tree = CgroupTree.under(base, "sec", "alice", tmp_path) if base is not None else None
    config = make_config(tmp_path, cgroups=tree)
    async with JobSupervisor(config) as supervisor:
        job = await supervisor.start(_liar("liar", steps=True))
        await wait_for_text(job.paths.control_dir / "progress.jsonl", '"kind":"step"')
        result = await supervisor.suspend("liar", timeout_s=5, enforce=True, park=True)
        assert supervisor.parked() == []
    # Before: believed (parked, its GPUs handed to the next job while it went on).
    assert not result.parked
    assert result.escalation == "SIGKILL"  # forced: reported and charged as an ignored yield
    assert result.exit.yielded and "after it said it parked" in (result.exit.reason or "")


@pytest.mark.skipif(locate(AUTO) is None, reason="no writable cgroup2 hierarchy here")
async def test_a_job_that_computes_after_saying_it_parked_is_frozen(tmp_path: Path) -> None:
    base = locate(AUTO)
    assert base is not None
    tree = CgroupTree.under(base, "sec", "alice", tmp_path)
    config = make_config(tmp_path, cgroups=tree)
    async with JobSupervisor(config) as supervisor:
        job = await supervisor.start(_liar("quiet", steps=False))
        await wait_for_text(job.paths.control_dir / "progress.jsonl", '"kind":"step"')
        result = await supervisor.suspend("quiet", timeout_s=5, enforce=True, park=True)
        assert result.parked and supervisor.busy_gpus() == frozenset()
        before = _cpu_seconds(job.pid)
        # Before: it spun on (half a second of CPU, a GPU's work with it).
        await consistently(lambda: _cpu_seconds(job.pid) - before < 0.05, 0.5)
        # Told to resume, it thaws; it never says it resumed, so it is not resumed in place.
        assert await supervisor.resume_in_place("quiet", timeout_s=0.5) is None
        await supervisor.kill("quiet", "cancelled")
        assert supervisor.running() == []
