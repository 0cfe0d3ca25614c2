"""A hostile tenant's job, on a node whose executor runs as root (issue 23, items 2, 6 and 7).

Each test runs the supervisors as the node executor does (one per tenant, each tenant's jobs as
the account derived from its name) and a job that attacks: it must find every door closed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from gfair.node.job_account import derived_account
from gfair.node.job_cgroup import AUTO, CgroupTree, locate, tenant_directory
from gfair.node.job_limits import JobLimits, LimitTree, v1_hierarchies
from gfair.node.job_runner import JobStartError
from gfair.node.lifecycle import CheckpointReport, ExitReport
from gfair.node.supervisor import JobSupervisor
from node.helpers import (
    EventLog,
    make_config,
    python_job,
    reachable_tmp,
    sdk_on_pythonpath,
    synthetic,
    wait_for_text,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the attacks are on an executor running as root (as CI runs)"
)
tmp_path = pytest.fixture(name="tmp_path")(reachable_tmp)
sdk_for_jobs = pytest.fixture(autouse=True)(sdk_on_pythonpath)

ALICE, BOB = derived_account("alice"), derived_account("bob")
# Bob's job: checkpoints once, prints a secret, then waits with one in its environment.
BOB_JOB = (
    "import os, sys, time\n"
    "from pathlib import Path\n"
    "from gfair.sdk.checkpoint import CheckpointStore\n"
    "CheckpointStore(Path(os.environ['GFAIR_CHECKPOINT_DIR'])).save({'secret': 'bob'}, step=777)\n"
    "print('bob-secret', flush=True)\n"
    "time.sleep(120)\n"
)


@contextlib.asynccontextmanager
async def _bob(root: Path) -> AsyncIterator[tuple[JobSupervisor, int]]:
    config = make_config(root / "bob", account=BOB)
    async with JobSupervisor(config) as supervisor:
        job = await supervisor.start(
            python_job("secret", BOB_JOB, env={"BOB_TOKEN": "hunter2"}, gpu_indices=(1,))
        )
        await wait_for_text(job.paths.stdout, "bob-secret")
        yield supervisor, job.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"):
            return False
    return True


async def test_a_job_reads_nothing_of_another_tenants_job(tmp_path: Path) -> None:
    async with _bob(tmp_path) as (_, bob_pid):
        bob_run = next((tmp_path / "bob" / "runs" / "secret").glob("run-*"))
        targets = {
            "environ": f"/proc/{bob_pid}/environ",
            "stdout": str(bob_run / "stdout.log"),
            "launch": str(bob_run / "launch.json"),
            "run_dir": str(bob_run),
            "checkpoints": str(tmp_path / "bob" / "checkpoints" / "secret"),
            "progress": str(bob_run / "control" / "progress.jsonl"),
        }
        spy = (
            "import json, os, sys\n"
            "out = {}\n"
            "for name, path in json.loads(sys.argv[1]).items():\n"
            "    try:\n"
            "        out[name] = os.listdir(path) if os.path.isdir(path) else open(path).read()\n"
            "    except OSError as error:\n"
            "        out[name] = type(error).__name__\n"
            "print(json.dumps(out))\n"
        )
        async with JobSupervisor(make_config(tmp_path / "alice", account=ALICE)) as alice:
            job = await alice.start(python_job("spy", spy, json.dumps(targets)))
            exited = await alice.wait("spy")
        assert exited.exit_code == 0, exited.stderr_tail
        seen = json.loads(job.paths.stdout.read_text())
        # Bob's process is not even there in alice's /proc (hidepid); the rest is closed.
        assert seen == {**dict.fromkeys(targets, "PermissionError"), "environ": "FileNotFoundError"}
        # Bob's run is bob's: its records are root's alone, its control directory bob's.
        assert bob_run.stat().st_mode & 0o777 == 0o711
        assert (bob_run / "stdout.log").stat().st_mode & 0o777 == 0o600
        assert (bob_run / "control").stat().st_uid == BOB.uid


async def test_a_job_cannot_work_in_etc_nor_have_root_make_its_directory(tmp_path: Path) -> None:
    async with JobSupervisor(make_config(tmp_path, account=ALICE)) as supervisor:
        for where in (Path("/etc"), Path("/etc/gfair-intruder")):
            with pytest.raises(JobStartError, match="not usable by the job's account"):
                await supervisor.start(python_job("vandal", "print(1)", workdir=where))
        assert not await anyio.Path("/etc/gfair-intruder").exists()
        mine = tmp_path / "mine"
        mine.mkdir(mode=0o777)
        mine.chmod(0o777)
        job = await supervisor.start(python_job("ok", "open('made', 'w')", workdir=mine / "sub"))
        assert (await supervisor.wait("ok")).exit_code == 0
        assert (job.paths.workdir / "made").stat().st_uid == ALICE.uid
        assert (mine / "sub").stat().st_uid == ALICE.uid  # made by the account, not root


async def test_a_job_cannot_leave_its_cgroups_and_dies_with_its_cancel(tmp_path: Path) -> None:
    base = locate(AUTO)
    legacy = v1_hierarchies()
    tree = CgroupTree.under(base, "sec", "alice", tmp_path) if base is not None else None
    limits = LimitTree.under(
        JobLimits(pids_max=64), tree, legacy, tenant_directory("sec", "alice", tmp_path)
    )
    roots = sorted({line.split()[4] for line in _cgroup_mounts()})
    escape = (
        "import json, os, sys, time\n"
        "out = {}\n"
        "for root in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        open(root + '/cgroup.procs', 'w').write(str(os.getpid()))\n"
        "        out[root] = 'moved'\n"
        "    except OSError as error:\n"
        "        out[root] = type(error).__name__\n"
        "print(json.dumps(out), flush=True)\n"
        "time.sleep(120)\n"
    )
    config = make_config(tmp_path, account=ALICE, cgroups=tree, limits=limits)
    try:
        async with JobSupervisor(config) as supervisor:
            job = await supervisor.start(python_job("escaper", escape, json.dumps(roots)))
            await wait_for_text(job.paths.stdout, "}")
            tried = json.loads(job.paths.stdout.read_text())
            await supervisor.kill("escaper", "cancelled")
        assert tried and set(tried.values()) == {"PermissionError"}, tried
        assert not _alive(job.pid)
    finally:
        if tree is not None:
            tree.sweep()
            tree.close()
        limits.sweep()
        limits.close()


def _cgroup_mounts() -> list[str]:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [
        line for line in lines if line.partition(" - ")[2].split(" ")[0] in ("cgroup", "cgroup2")
    ]


async def test_a_forged_checkpoint_path_is_not_published(tmp_path: Path) -> None:
    async with _bob(tmp_path):
        bob_checkpoint = next((tmp_path / "bob" / "checkpoints" / "secret").glob("ckpt-*"))
        forger = (
            "import json, os, sys, time\n"
            "from pathlib import Path\n"
            "control = Path(os.environ['GFAIR_CONTROL_DIR'])\n"
            "mine = Path(os.environ['GFAIR_CHECKPOINT_DIR'])\n"
            "os.symlink(sys.argv[1], mine / Path(sys.argv[1]).name)\n"
            "record = {'kind': 'checkpoint', 'time': time.time(), 'step': 777, 'seq': 9,\n"
            "          'checkpoint_path': sys.argv[1]}\n"
            "with open(control / 'progress.jsonl', 'a') as out:\n"
            "    out.write(json.dumps(record) + '\\n')\n"
            "time.sleep(1)\n"
        )
        async with JobSupervisor(make_config(tmp_path / "alice", account=ALICE)) as alice:
            log = EventLog(alice.events)
            await alice.start(python_job("forger", forger, str(bob_checkpoint)))
            exited = await log.first(ExitReport)
        assert exited.exit_code == 0, exited.stderr_tail
        assert log.of(CheckpointReport) == []
        assert exited.checkpoint is None


async def test_a_fork_bomb_is_capped_at_the_process_limit(tmp_path: Path) -> None:
    base = locate(AUTO)
    tree = CgroupTree.under(base, "sec", "alice", tmp_path) if base is not None else None
    limits = LimitTree.under(
        JobLimits(pids_max=40), tree, v1_hierarchies(), tenant_directory("sec", "alice", tmp_path)
    )
    bomb = (
        "import os, time\n"
        "made = 0\n"
        "for _ in range(250):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    made += 1\n"
        "print(made, flush=True)\n"
        "time.sleep(60)\n"
    )
    config = make_config(tmp_path, account=ALICE, cgroups=tree, limits=limits)
    try:
        async with JobSupervisor(config) as supervisor:
            job = await supervisor.start(python_job("bomb", bomb))
            await wait_for_text(job.paths.stdout, "\n", timeout_s=30)
            await supervisor.kill("bomb", "cancelled")
        made = int(job.paths.stdout.read_text())
        assert made < 40  # the shell gate and the job itself count too
    finally:
        if tree is not None:
            tree.sweep()
            tree.close()
        limits.sweep()
        limits.close()


async def test_stopping_the_supervisor_leaves_no_process_of_a_deaf_job(
    tmp_path: Path,
) -> None:
    deaf = (
        "import os, signal, subprocess, sys, time\n"
        "for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):\n"
        "    signal.signal(sig, signal.SIG_IGN)\n"
        "child = subprocess.Popen(['sleep', '600'], start_new_session=True, env={})\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    base = locate(AUTO)
    tree = CgroupTree.under(base, "sec", "alice", tmp_path) if base is not None else None
    limits = LimitTree.under(
        JobLimits(pids_max=64), tree, v1_hierarchies(), tenant_directory("sec", "alice", tmp_path)
    )
    config = make_config(
        tmp_path, account=ALICE, cgroups=tree, limits=limits, shutdown_timeout_s=0.5
    )
    started = time.monotonic()
    try:
        async with JobSupervisor(config) as supervisor:
            job = await supervisor.start(python_job("deaf", deaf))
            await wait_for_text(job.paths.stdout, "\n")
            child = int(job.paths.stdout.read_text())
        # Gone when the block is left: killed and reaped, not merely signalled.
        assert not _alive(job.pid) and not _alive(child)
    finally:
        if tree is not None:
            tree.sweep()
            tree.close()
        limits.sweep()
        limits.close()
    assert time.monotonic() - started < 30
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signal.SIGKILL)


async def test_a_job_sees_no_process_of_another_tenant_and_no_job_id_of_its(
    tmp_path: Path,
) -> None:
    """Issue 41's lows: another tenant's argv was readable in /proc, and a stat under its run
    tree told an existing job id (EACCES) from a missing one (ENOENT)."""
    async with _bob(tmp_path) as (_, bob_pid):
        spy = (
            "import json, os, sys\n"
            "pids = [int(p) for p in os.listdir('/proc') if p.isdigit()]\n"
            "def errno_of(path):\n"
            "    try:\n"
            "        os.stat(path)\n"
            "        return 'found'\n"
            "    except OSError as error:\n"
            "        return error.errno\n"
            "runs = sys.argv[2]\n"
            "print(json.dumps({\n"
            "    'bob_visible': int(sys.argv[1]) in pids,\n"
            "    'own_visible': os.getpid() in pids,\n"
            "    'existing': errno_of(runs + '/secret'),\n"
            "    'missing': errno_of(runs + '/no-such-job'),\n"
            "}))\n"
        )
        bob_runs = tmp_path / "bob" / "runs"
        assert (bob_runs / "secret").is_dir()
        async with JobSupervisor(make_config(tmp_path / "alice", account=ALICE)) as alice:
            job = await alice.start(python_job("spy", spy, str(bob_pid), str(bob_runs)))
            exited = await alice.wait("spy")
        assert exited.exit_code == 0, exited.stderr_tail
        seen = json.loads(job.paths.stdout.read_text())
    assert seen == {
        "bob_visible": False,
        "own_visible": True,
        "existing": errno.EACCES,
        "missing": errno.EACCES,
    }


async def test_a_program_in_a_closed_directory_fails_alike_whether_it_exists_or_not(
    tmp_path: Path,
) -> None:
    """Issue 41's low: root looked up argv[0] and reported its errno, an existence oracle."""
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    (closed / "tool").write_text("#!/bin/sh\n")
    (closed / "tool").chmod(0o755)
    reasons = []
    async with JobSupervisor(make_config(tmp_path / "alice", account=ALICE)) as alice:
        for name in ("tool", "no-such-tool"):
            launch = dataclasses.replace(
                synthetic(f"probe-{name}", (0,), "v100"), argv=(str(closed / name),)
            )
            with pytest.raises(JobStartError) as refused:
                await alice.start(launch)
            reasons.append(str(refused.value).replace(name, "NAME"))
    assert reasons[0] == reasons[1]
    assert "Permission denied" in reasons[0]
