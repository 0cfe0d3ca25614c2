"""The eBPF device program of a job's cgroup v2 (`gfair.node.device_program`), on this kernel."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gfair.node import device_program
from gfair.node.job_cgroup import AUTO, CgroupTree, JobCgroup, locate
from gfair.node.job_limits import device_rules

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="loading eBPF programs and making device nodes need root"
)

# Opens each path given and prints the errno it got (0: opened).
OPENER = (
    "import os, sys\n"
    "open(sys.argv[1] + '/cgroup.procs', 'w').write(str(os.getpid()))\n"
    "for path in sys.argv[2:]:\n"
    "    try:\n"
    "        os.close(os.open(path, os.O_RDWR))\n"
    "        print(0)\n"
    "    except OSError as error:\n"
    "        print(error.errno)\n"
)


@pytest.fixture
def cgroup(tmp_path: Path) -> Iterator[JobCgroup]:
    base = locate(AUTO)
    assert base is not None, "CI's machine makes cgroups (v2) under the executor's own"
    tree = CgroupTree.under(base, "devices", "alice", tmp_path)
    try:
        yield tree.job("probe")
    finally:
        tree.sweep()
        tree.close()


def opened(cgroup: JobCgroup, *paths: Path) -> list[int]:
    done = subprocess.run(
        [sys.executable, "-c", OPENER, str(cgroup.path), *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [int(line) for line in done.stdout.split()]


def test_a_cgroup_opens_only_the_devices_its_program_allows_and_a_new_one_replaces_it(
    tmp_path: Path, cgroup: JobCgroup
) -> None:
    gpus = [tmp_path / f"nvidia{index}" for index in range(2)]
    for index, node in enumerate(gpus):
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(195, index))
    null = Path("/dev/null")
    # Before: every node opens as far as its driver (none behind major 195 here: ENXIO).
    assert opened(cgroup, null, *gpus) == [0, errno.ENXIO, errno.ENXIO]
    device_program.allow_only(cgroup.path, device_rules([gpus[0]], dev=tmp_path))
    assert opened(cgroup, null, *gpus) == [0, errno.ENXIO, errno.EPERM]
    # Moved to the other GPU: the new program replaces the old one.
    device_program.allow_only(cgroup.path, device_rules([gpus[1]], dev=tmp_path))
    assert opened(cgroup, null, *gpus) == [0, errno.EPERM, errno.ENXIO]


def test_a_program_allows_a_whole_major_and_denies_any_other_type() -> None:
    code = device_program.program(["c 136:* rwm", "c 1:3 rwm"])
    # Four loads, then 2 checks + allow for the first rule, 3 + allow for the second, deny.
    assert len(code) // 8 == 4 + (2 + 2) + (3 + 2) + 2
    assert device_program.available()
