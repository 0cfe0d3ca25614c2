"""A hostile tenant's job against how its process starts (issue 41, items 3, 6 and 7): its
``LD_PRELOAD``, the device nodes of GPUs it was not given, and files it leaves in ``/dev/shm``.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from gfair.node.job_account import derived_account
from gfair.node.job_cgroup import AUTO, CgroupTree, locate, tenant_directory
from gfair.node.job_limits import DEVICES, JobLimits, LimitTree, v1_hierarchies
from gfair.node.supervisor import JobSupervisor
from node.helpers import make_config, python_job, reachable_tmp
from support.waiting import eventually

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the attacks are on an executor running as root (as CI runs)"
)
tmp_path = pytest.fixture(name="tmp_path")(reachable_tmp)

ALICE = derived_account("alice")
SHM_FILE = "/dev/shm/gfair-left-behind"
# What the loader runs first in every process it starts with this library preloaded: a record of
# the account and the cgroups it found itself in (where a daemon it forked would stay).
PRELOAD_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void tenant(void) {
    char path[512], line[512];
    snprintf(path, sizeof path, "%s/%d", getenv("PRELOAD_OUT"), (int)getpid());
    FILE *out = fopen(path, "a"), *in = fopen("/proc/self/cgroup", "r");
    if (!out || !in) return;
    fprintf(out, "uid %d\n", (int)getuid());
    while (fgets(line, sizeof line, in)) fputs(line, out);
    fclose(in); fclose(out);
}
"""


@pytest.fixture
def trees(tmp_path: Path) -> Iterator[tuple[CgroupTree | None, LimitTree]]:
    base = locate(AUTO)
    tree = CgroupTree.under(base, "sec", "alice", tmp_path) if base is not None else None
    legacy = v1_hierarchies()
    limits = LimitTree.under(
        JobLimits(pids_max=64, memory_per_gpu=1 << 30, devices=DEVICES in legacy),
        tree,
        legacy,
        tenant_directory("sec", "alice", tmp_path),
    )
    try:
        yield tree, limits
    finally:
        if tree is not None:
            tree.sweep()
            tree.close()
        limits.sweep()
        limits.close()


async def test_an_ld_preload_runs_only_in_the_job_inside_its_cgroups(
    tmp_path: Path, trees: tuple[CgroupTree | None, LimitTree]
) -> None:
    source, library = tmp_path / "tenant.c", tmp_path / "tenant.so"
    source.write_text(PRELOAD_C)
    await anyio.run_process(["cc", "-shared", "-fPIC", "-o", str(library), str(source)])
    library.chmod(0o755)
    out = tmp_path / "preload"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    tree, limits = trees
    config = make_config(tmp_path, account=ALICE, cgroups=tree, limits=limits)
    async with JobSupervisor(config) as supervisor:
        env = {"LD_PRELOAD": str(library), "PRELOAD_OUT": str(out)}
        await supervisor.start(python_job("preloaded", "print('ran')", env=env))
        exited = await supervisor.wait("preloaded")
    assert exited.exit_code == 0, exited.stderr_tail
    # One file per pid, a record per program the loader started in it (a shell that execs
    # the job keeps its pid).
    records = [r for path in out.iterdir() for r in path.read_text().split("uid ") if r]
    assert records  # the job's own process loaded it
    for record in records:
        # Never in a process of root's, and never before the process was in its cgroups.
        assert record.startswith(f"{ALICE.uid}\n"), record
        for line in record.splitlines()[1:]:
            _, controllers, cgroup = line.split(":", 2)
            if controllers in ("", "memory", "pids"):
                assert "/alice/preloaded" in cgroup, record


async def test_a_job_opens_no_device_node_of_a_gpu_it_was_not_given(
    tmp_path: Path, trees: tuple[CgroupTree | None, LimitTree]
) -> None:
    tree, limits = trees
    # Through the job's v2 cgroup's device program where the host allows one (as here), else
    # its v1 devices cgroup.
    assert DEVICES in (*limits.unified, *limits.legacy), "devices are limited on CI's machine"
    nodes = {}
    for index in (0, 1):
        node = tmp_path / f"nvidia{index}"
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(195, index))
        node.chmod(0o666)
        nodes[index] = node
    probe = (
        "import json, os, sys\n"
        "os.environ.pop('CUDA_VISIBLE_DEVICES', None)\n"
        "out = {}\n"
        "for name, path in json.loads(sys.argv[1]).items():\n"
        "    try:\n"
        "        os.close(os.open(path, os.O_RDWR))\n"
        "        out[name] = 0\n"
        "    except OSError as error:\n"
        "        out[name] = error.errno\n"
        "print(json.dumps(out))\n"
    )
    config = make_config(
        tmp_path,
        account=ALICE,
        cgroups=tree,
        limits=limits,
        gpu_devices=nodes,
        gpu_indices=frozenset(nodes),
    )
    async with JobSupervisor(config) as supervisor:
        job = await supervisor.start(
            python_job("probe", probe, json.dumps({"own": str(nodes[0]), "other": str(nodes[1])}))
        )
        exited = await supervisor.wait("probe")
    assert exited.exit_code == 0, exited.stderr_tail
    seen = json.loads(job.paths.stdout.read_text())
    # No driver behind major 195 here: its own GPU's node gets as far as the driver (ENXIO, or
    # opens where there is one); the other GPU's is refused by its cgroup.
    assert seen["own"] in (0, errno.ENXIO) and seen["other"] == errno.EPERM, seen


async def test_files_a_job_leaves_in_dev_shm_and_its_tmpdir_go_with_it(
    tmp_path: Path, trees: tuple[CgroupTree | None, LimitTree]
) -> None:
    tree, limits = trees
    leave = (
        "import os, tempfile\n"
        f"open({SHM_FILE!r}, 'wb').write(b'x' * (1 << 20))\n"
        "fd, path = tempfile.mkstemp(prefix='gfair-left-behind')\n"
        "os.write(fd, b'x' * (1 << 20))\n"
        "print(path)\n"
    )
    config = make_config(tmp_path, account=ALICE, cgroups=tree, limits=limits)
    try:
        async with JobSupervisor(config) as supervisor:
            job = await supervisor.start(python_job("litter", leave))
            exited = await supervisor.wait("litter")
        assert exited.exit_code == 0, exited.stderr_tail
        left = Path(job.paths.stdout.read_text().strip())
        assert not await anyio.Path(SHM_FILE).exists()
        assert not await anyio.Path(left).exists()
    finally:
        await anyio.Path(SHM_FILE).unlink(missing_ok=True)


def _zombies_of(uid: int) -> int:
    """Zombie processes of `uid` whose parent is this process (the test's executor)."""
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_bytes().rsplit(b") ", 1)[1].split()
            owner = entry.stat().st_uid
        except OSError:
            continue
        if fields[0] == b"Z" and int(fields[1]) == os.getpid() and owner == uid:
            count += 1
    return count


async def test_the_orphans_a_job_leaves_are_collected(
    tmp_path: Path, trees: tuple[CgroupTree | None, LimitTree]
) -> None:
    """Issue 41's second red-team pass: children that called setsid and exited became zombies
    of the executor (the subreaper of a job's orphans) once the job ended, and stayed until it
    exited: 1,301 after three jobs. (Forty here: the job may have 64 processes.)"""
    tree, limits = trees
    orphans = (
        "import os, time\n"
        "for _ in range(40):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        os._exit(0)\n"
        "time.sleep(0.5)\n"
    )
    # An account of its own: the zombies counted are this test's only.
    account = derived_account("orphan-maker")
    config = make_config(tmp_path, account=account, cgroups=tree, limits=limits)
    async with JobSupervisor(config) as supervisor:
        await supervisor.start(python_job("orphans", orphans))
        exited = await supervisor.wait("orphans")
        assert exited.exit_code == 0, exited.stderr_tail
        await eventually(lambda: _zombies_of(account.uid) == 0, timeout_s=10)


async def test_what_a_job_leaves_in_the_shared_tmp_goes_once_its_account_runs_nothing(
    tmp_path: Path, trees: tuple[CgroupTree | None, LimitTree]
) -> None:
    """The second red-team pass: 50 MB in /tmp and /var/tmp (and a world-writable directory)
    outlived the job, held by no cgroup."""
    tree, limits = trees
    secret = tmp_path / "root-only"
    secret.write_text("root's")
    name = f"gfair-left-{os.getpid()}"
    litter = (
        "import os, sys\n"
        "name, secret = sys.argv[1], sys.argv[2]\n"
        "open(f'/tmp/{name}', 'wb').write(b'x' * (1 << 20))\n"
        "open(f'/var/tmp/{name}', 'wb').write(b'x' * (1 << 20))\n"
        "os.mkdir(f'/tmp/{name}.d', 0o777)\n"
        "open(f'/tmp/{name}.d/inner', 'w').write('x')\n"
        "os.symlink(secret, f'/tmp/{name}.link')\n"
    )
    config = make_config(tmp_path, account=ALICE, cgroups=tree, limits=limits)
    async with JobSupervisor(config) as supervisor:
        await supervisor.start(python_job("litter-tmp", litter, name, str(secret)))
        exited = await supervisor.wait("litter-tmp")
    assert exited.exit_code == 0, exited.stderr_tail
    left = [Path(f"/tmp/{name}"), Path(f"/var/tmp/{name}"), Path(f"/tmp/{name}.d")]
    left.append(Path(f"/tmp/{name}.link"))
    assert [p for p in left if p.exists() or p.is_symlink()] == []
    assert secret.read_text() == "root's"  # the link went, not what it pointed at
