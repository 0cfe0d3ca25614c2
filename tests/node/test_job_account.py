"""Jobs run as their tenant's OS account when the executor is root (issue 11, item 4)."""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import gfair
from gfair.node.job_account import (
    DEFAULT_JOB_UID_BASE,
    JobAccount,
    derived_account,
    parse_account,
    parse_accounts,
)
from gfair.node.launch import RunSpec
from gfair.node.lifecycle import ExitReport
from gfair.node.supervisor import JobSupervisor
from gfair_services.node_executor.settings import NodeExecutorSettings, parse_job_accounts

from .helpers import EventLog, make_config, synthetic, wait_for_text

ALICE = JobAccount(20001, 20001)
BOB = JobAccount(20002, 20002)


@pytest.fixture
def shared_root() -> Iterator[Path]:
    # pytest's own temporary directories are closed to other users: a job running as another
    # account could not even enter its working directory there.
    with tempfile.TemporaryDirectory(prefix="gfair-accounts-") as name:
        root = Path(name)
        root.chmod(0o755)
        yield root


def _open_to_others(path: Path) -> bool:
    """Whether an account other than the file's owner may run `path` (every directory above
    it searchable, the file executable, by others)."""
    path = path.resolve()
    return all(p.stat().st_mode & 0o001 for p in (path, *path.parents))


# The job runs as another account, so it needs an interpreter that account may run (a venv's
# may live under root's home) and the SDK from this checkout (it depends on nothing else).
PYTHON = next(
    (
        Path(p)
        for p in (sys.executable, "/usr/local/bin/python3", "/usr/bin/python3")
        if Path(p).exists() and _open_to_others(Path(p))
    ),
    None,
)
LIBS = Path(gfair.__file__).resolve().parents[1]
SDK_ENV = {"PYTHONPATH": str(LIBS)}

as_root = pytest.mark.skipif(
    os.geteuid() != 0 or PYTHON is None or not _open_to_others(LIBS),
    reason="switching accounts needs root, and a Python and checkout other accounts may use",
)


def _python(job_id: str, code: str) -> RunSpec:
    assert PYTHON is not None
    return RunSpec(
        job_id=job_id,
        argv=(str(PYTHON), "-c", code),
        gpu_indices=(0,),
        generation="v100",
        env=SDK_ENV,
    )


@as_root
async def test_a_job_runs_as_its_tenants_account_with_no_extra_groups(shared_root: Path) -> None:
    config = make_config(shared_root / "alice", account=ALICE)
    code = "import os; print(os.getuid(), os.getgid(), os.getgroups(), os.environ['HOME'])"
    async with JobSupervisor(config) as supervisor:
        log = EventLog(supervisor.events)
        job = await supervisor.start(_python("who", code))
        exited = await log.first(ExitReport)
    assert exited.exit_code == 0
    uid, gid, groups, home = job.paths.stdout.read_text().split(maxsplit=3)
    assert (int(uid), int(gid), groups) == (ALICE.uid, ALICE.gid, "[]")
    assert home.strip() == str(job.paths.workdir)
    for owned in (config.checkpoint_root, job.paths.checkpoint_dir, job.paths.control_dir):
        info = owned.stat()
        assert (info.st_uid, info.st_mode & 0o777) == (ALICE.uid, 0o700), owned


@as_root
async def test_a_tenants_job_cannot_read_another_tenants_checkpoints(shared_root: Path) -> None:
    bob = make_config(shared_root / "bob", account=BOB)
    async with JobSupervisor(bob) as supervisor:
        log = EventLog(supervisor.events)
        await supervisor.start(
            _python("keep", "import os; open(os.environ['GFAIR_CHECKPOINT_DIR'] + '/w', 'w')")
        )
        assert (await log.first(ExitReport)).exit_code == 0
    secret = bob.checkpoint_root / "keep" / "w"
    assert secret.exists() and secret.stat().st_uid == BOB.uid

    alice = make_config(shared_root / "alice", account=ALICE)
    async with JobSupervisor(alice) as supervisor:
        log = EventLog(supervisor.events)
        job = await supervisor.start(_python("peek", f"open({str(secret)!r}).read()"))
        exited = await log.first(ExitReport)
    assert exited.exit_code != 0
    assert "PermissionError" in job.paths.stderr.read_text()


@as_root
async def test_a_job_under_an_account_checkpoints_suspends_and_resumes(shared_root: Path) -> None:
    config = make_config(shared_root / "alice", account=ALICE)
    assert PYTHON is not None
    launch = synthetic("train", (0,), "v100", "--iterations", "300", "--speed-scale", "20")
    launch = dataclasses.replace(launch, argv=(str(PYTHON), *launch.argv[1:]), env=SDK_ENV)
    async with JobSupervisor(config) as supervisor:
        job = await supervisor.start(launch)
        await wait_for_text(job.paths.control_dir / "progress.jsonl", '"kind":"ready"')
        result = await supervisor.suspend("train", timeout_s=10)
        assert result.checkpoint is not None and result.exit.yielded
        resumed = await supervisor.start(
            dataclasses.replace(launch, resume_from=result.checkpoint, attempt=2)
        )
        exited = await supervisor.wait("train")
    assert resumed.paths.run_dir != job.paths.run_dir
    assert exited.exit_code == 0 and exited.checkpoint is not None
    assert exited.checkpoint.step == 300 and result.checkpoint.step > 0
    assert exited.completed


def test_accounts_are_checked() -> None:
    assert parse_account("20001") == JobAccount(20001, 20001)
    assert parse_account("20001:30000") == JobAccount(20001, 30000)
    assert parse_account("nobody").uid > 0
    for bad, says in (
        ("0", "never run as root"),
        ("20001:0", "never run as root"),
        ("root", "never run as root"),
        ("no-such-user-here", "no such OS user"),
        ("20001:staff", "gid must be a number"),
    ):
        with pytest.raises(ValueError, match=says):
            parse_account(bad)
    with pytest.raises(ValueError, match="share uid 20001"):
        parse_accounts({"alice": "20001", "bob": "20001:20002"})


def test_the_executor_setting_names_an_account_per_tenant() -> None:
    accounts = parse_job_accounts("alice=20001, bob=20002:20002, *=nobody")
    assert accounts["alice"] == ALICE and accounts["bob"] == BOB
    for bad in ("alice", "alice=", "a.b=20001", "alice=20001,alice=20003"):
        with pytest.raises(ValueError, match="job_accounts"):
            parse_job_accounts(bad)
    if os.geteuid() == 0:
        settings = NodeExecutorSettings(node_id="n1", job_accounts="alice=20001")
        assert settings.account_for("alice") == ALICE
        # A tenant the mapping does not name gets its own uid, never root nor the executor's.
        bob = settings.account_for("bob")
        assert bob == derived_account("bob") and bob.uid >= DEFAULT_JOB_UID_BASE
        anyone = NodeExecutorSettings(node_id="n1").account_for("anyone")
        assert anyone == derived_account("anyone") != bob
    else:
        assert NodeExecutorSettings(node_id="n1").account_for("anyone") is None
