"""A hostile tenant's links, on a node whose executor runs as root (issue 41, item 2).

A job owns its tenant's checkpoint root, so it may put a symbolic link wherever root is about to
make, give away or clean a job's directory. Root must refuse the job's start with the reason
and leave the link's target as it was; the supervisor goes on with other jobs. The run tree is
root's: the links planted there stand for anyone who could write it (a work base opened too
widely), and are refused all the same.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gfair.node.job_account import derived_account
from gfair.node.job_runner import JobStartError
from gfair.node.supervisor import JobSupervisor
from gfair.sdk.environment import PARKED_MARKER
from node.helpers import (
    make_config,
    python_job,
    reachable_tmp,
    sdk_on_pythonpath,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the attacks are on an executor running as root (as CI runs)"
)
tmp_path = pytest.fixture(name="tmp_path")(reachable_tmp)
sdk_for_jobs = pytest.fixture(autouse=True)(sdk_on_pythonpath)

ALICE, BOB = derived_account("alice"), derived_account("bob")
# Replaces the job's own checkpoint directory with a link to argv[1], then dies.
SWAP_AND_DIE = (
    "import os, sys\n"
    "mine = os.environ['GFAIR_CHECKPOINT_DIR']\n"
    "os.rename(mine, mine + '.aside')\n"
    "os.symlink(sys.argv[1], mine)\n"
    "sys.exit(1)\n"
)


def _root_directory(path: Path) -> Path:
    """Root's, as a virtual environment's site-packages is: what a link would aim at."""
    path.mkdir()
    path.chmod(0o755)
    return path


def _untouched(path: Path) -> None:
    info = path.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (0, 0, 0o755)
    assert list(path.iterdir()) == []


async def _still_runs_jobs(supervisor: JobSupervisor) -> None:
    await supervisor.start(python_job("next", "print('fine')"))
    assert (await supervisor.wait("next")).exit_code == 0


async def test_a_link_in_place_of_a_new_jobs_checkpoint_directory_is_refused(
    tmp_path: Path,
) -> None:
    target = _root_directory(tmp_path / "site-packages")
    plant = (
        "import os, sys\n"
        "os.symlink(sys.argv[1], os.environ['GFAIR_CHECKPOINT_DIR'] + '/../victim1')\n"
    )
    async with JobSupervisor(make_config(tmp_path, account=ALICE)) as supervisor:
        await supervisor.start(python_job("planter", plant, str(target)))
        assert (await supervisor.wait("planter")).exit_code == 0
        assert (tmp_path / "checkpoints" / "victim1").is_symlink()
        with pytest.raises(JobStartError, match="victim1 is a symbolic link"):
            await supervisor.start(python_job("victim1", "print('root is mine')"))
        _untouched(target)
        await _still_runs_jobs(supervisor)


async def test_a_retry_after_its_job_swapped_its_directory_for_a_link_is_refused(
    tmp_path: Path,
) -> None:
    target = _root_directory(tmp_path / "site-packages")
    async with JobSupervisor(make_config(tmp_path, account=ALICE)) as supervisor:
        await supervisor.start(python_job("swapper", SWAP_AND_DIE, str(target)))
        assert (await supervisor.wait("swapper")).exit_code == 1
        retry = python_job("swapper", SWAP_AND_DIE, str(target), attempt=2)
        with pytest.raises(JobStartError, match="swapper is a symbolic link"):
            await supervisor.start(retry)
        _untouched(target)
        await _still_runs_jobs(supervisor)


async def test_a_dying_job_cannot_have_root_remove_another_jobs_parked_marker(
    tmp_path: Path,
) -> None:
    # Bob's job is parked in place on another node: its marker holds every start of it.
    bobs = tmp_path / "bob-checkpoints" / "trainer"
    bobs.mkdir(parents=True)
    (bobs / PARKED_MARKER).write_text("{}")
    os.chown(bobs, BOB.uid, BOB.gid)
    async with JobSupervisor(make_config(tmp_path, account=ALICE)) as supervisor:
        await supervisor.start(python_job("swapper", SWAP_AND_DIE, str(bobs)))
        assert (await supervisor.wait("swapper")).exit_code == 1
    assert (bobs / PARKED_MARKER).exists()


async def test_a_link_in_place_of_a_jobs_run_directory_is_refused(tmp_path: Path) -> None:
    target = _root_directory(tmp_path / "site-packages")
    async with JobSupervisor(make_config(tmp_path, account=ALICE)) as supervisor:
        (tmp_path / "runs" / "victim2").symlink_to(target)
        with pytest.raises(JobStartError, match="victim2 is a symbolic link"):
            await supervisor.start(python_job("victim2", "print('root is mine')"))
        _untouched(target)
        await _still_runs_jobs(supervisor)


async def test_a_link_in_place_of_a_runs_log_is_not_read_into_its_exit(tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("root-secret\n")
    secret.chmod(0o600)
    # Waits for the word to go, after the test put the link in place of its stderr.log.
    wait_then_fail = (
        "import os, sys, time\n"
        "go = os.path.join(os.environ['GFAIR_CONTROL_DIR'], 'go')\n"
        "while not os.path.exists(go):\n"
        "    time.sleep(0.01)\n"
        "sys.exit('failed')\n"
    )
    async with JobSupervisor(make_config(tmp_path, account=ALICE)) as supervisor:
        job = await supervisor.start(python_job("teller", wait_then_fail))
        job.paths.stderr.unlink()
        job.paths.stderr.symlink_to(secret)
        (job.paths.control_dir / "go").write_text("")
        exited = await supervisor.wait("teller")
        assert exited.exit_code == 1
        assert "root-secret" not in exited.stderr_tail
        await _still_runs_jobs(supervisor)
