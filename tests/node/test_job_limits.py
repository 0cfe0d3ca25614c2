"""Memory and CPU limits per job (issue 11, item 4), enforced by the kernel.

The limit tests run real jobs under the host's controllers: cgroup v2 where the job cgroups can
have them, else the v1 hierarchies (the project's machines bind memory and cpu to v1). Where the
host has neither, they are skipped with that reason.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from gfair.core.failure import ExitFacts, FailureClass, classify
from gfair.node import job_limits
from gfair.node.job_cgroup import AUTO, CgroupTree, locate, tenant_directory
from gfair.node.job_limits import (
    JobLimits,
    LimitError,
    LimitTree,
    check_host,
    parse_size,
    v1_hierarchies,
)
from gfair.node.supervisor import JobSupervisor
from gfair_services.node_executor.settings import NodeExecutorSettings

from .helpers import JOB_PYTHON, make_config, synthetic

BASE = locate(AUTO)


def _host_refuses(limits: JobLimits) -> str | None:
    try:
        check_host(limits, BASE)
    except LimitError as error:
        return str(error)
    return None


MEMORY = JobLimits(memory_per_gpu=64 << 20)
CPU = JobLimits(cpus_per_gpu=0.1)
needs_memory = pytest.mark.skipif(_host_refuses(MEMORY) is not None, reason="no memory controller")
needs_cpu = pytest.mark.skipif(_host_refuses(CPU) is not None, reason="no cpu controller")

# Touches 256 MiB page by page: far over a 64 MiB limit, well within the machine.
GREEDY = (
    JOB_PYTHON,
    "-c",
    "import sys; b = bytearray(256 << 20)\n"
    "for i in range(0, len(b), 4096): b[i] = 1\n"
    "print('survived', file=sys.stderr)",
)
# Spins for 1.5 s of wall time and prints the CPU seconds it got in that time.
SPINNER = (
    JOB_PYTHON,
    "-c",
    "import time; start, cpu = time.monotonic(), time.process_time()\n"
    "while time.monotonic() - start < 1.5: pass\n"
    "print((time.process_time() - cpu) / (time.monotonic() - start))",
)


@pytest.fixture
def trees(tmp_path: Path) -> Iterator[tuple[CgroupTree | None, Path]]:
    tree = CgroupTree.under(BASE, "test", "alice", tmp_path) if BASE is not None else None
    yield tree, tenant_directory("test", "alice", tmp_path)
    if tree is not None:
        tree.sweep()
        tree.close()


async def _run(
    tmp_path: Path, trees: tuple[CgroupTree | None, Path], limits: JobLimits, argv: tuple[str, ...]
) -> tuple[int, str, str, LimitTree]:
    """Run `argv` as a one-GPU job under `limits`: (return code, stdout, stderr tail, tree)."""
    tree, relative = trees
    limit_tree = LimitTree.under(limits, tree, v1_hierarchies(), relative)
    launch = dataclasses.replace(synthetic("j1", (0,), "v100"), argv=argv)
    config = make_config(tmp_path, cgroups=tree, limits=limit_tree)
    async with JobSupervisor(config) as supervisor:
        handle = await supervisor.start(launch)
        exited = await supervisor.wait("j1")
    code = exited.exit_code if exited.exit_code is not None else -(exited.signal or 0)
    return code, handle.paths.stdout.read_text(), exited.stderr_tail, limit_tree


@needs_memory
async def test_a_job_over_its_memory_limit_is_killed_and_reported_as_out_of_memory(
    tmp_path: Path, trees: tuple[CgroupTree | None, Path]
) -> None:
    code, _, tail, limit_tree = await _run(tmp_path, trees, MEMORY, GREEDY)
    assert code == -signal.SIGKILL
    assert "survived" not in tail
    assert "over its memory limit of 0.0625 GiB" in tail
    verdict = classify(ExitFacts(signal=signal.SIGKILL, stderr_tail=tail))
    # Not the node's fault: retrying it elsewhere would only fail again.
    assert verdict.kind is FailureClass.OUT_OF_MEMORY
    limit_tree.close()
    assert all(not path.exists() for path in limit_tree.legacy.values())


@needs_memory
async def test_a_job_within_its_memory_limit_runs_as_without_one(
    tmp_path: Path, trees: tuple[CgroupTree | None, Path]
) -> None:
    roomy = JobLimits(memory_per_gpu=1 << 30)
    code, _, tail, limit_tree = await _run(tmp_path, trees, roomy, GREEDY)
    assert code == 0
    assert "survived" in tail
    assert "memory limit" not in tail
    assert all(not (path / "j1").exists() for path in limit_tree.legacy.values())
    limit_tree.close()


@needs_cpu
async def test_a_job_is_held_to_its_cpu_quota(
    tmp_path: Path, trees: tuple[CgroupTree | None, Path]
) -> None:
    code, stdout, _, limit_tree = await _run(tmp_path, trees, CPU, SPINNER)
    limit_tree.close()
    assert code == 0
    # 0.1 CPU per GPU: a spinning job gets about a tenth of a core (unlimited, about one).
    assert float(stdout) < 0.3


@pytest.mark.parametrize(
    ("text", "size"),
    [("512M", 512 << 20), ("16G", 16 << 30), ("1.5GiB", 3 << 29), ("2097152", 2 << 20)],
)
def test_sizes_read_as_people_write_them(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "16Q", "-1G", "100"])
def test_a_size_that_is_none_or_too_small_is_refused_with_the_reason(text: str) -> None:
    with pytest.raises(LimitError, match=repr(text)):
        parse_size(text)


def test_the_executor_settings_refuse_a_bad_limit() -> None:
    with pytest.raises(ValueError, match="job_memory_per_gpu"):
        NodeExecutorSettings(job_memory_per_gpu="plenty")
    with pytest.raises(ValueError, match="job_cpus_per_gpu"):
        NodeExecutorSettings(job_cpus_per_gpu=0)
    settings = NodeExecutorSettings(job_memory_per_gpu="8G", job_cpus_per_gpu=4)
    # The default process limit comes where the host has a pids controller for it.
    pids = settings.job_limits.pids_max
    assert pids in (4096, None)
    assert settings.job_limits == JobLimits(memory_per_gpu=8 << 30, cpus_per_gpu=4.0, pids_max=pids)
    assert NodeExecutorSettings(job_pids_max=0).job_limits.controllers == ()
    assert NodeExecutorSettings().job_limits.controllers in ((), ("pids",))


def test_a_limit_the_host_cannot_enforce_stops_the_executor_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No v1 hierarchy and no job cgroups: nothing could hold the job to its limit.
    monkeypatch.setattr(job_limits, "v1_hierarchies", dict)
    with pytest.raises(ValueError, match="no memory controller"):
        NodeExecutorSettings(job_memory_per_gpu="8G", job_cgroups="off")
    NodeExecutorSettings(job_cgroups="off")  # without limits it starts as before


def test_limits_scale_with_the_gpus_a_job_holds_on_the_node() -> None:
    limits = JobLimits(memory_per_gpu=4 << 30, cpus_per_gpu=2.5)
    assert limits.values(2, unified=True) == {
        "memory": {"memory.max": str(8 << 30), "memory.swap.max": "0"},
        "cpu": {"cpu.max": "500000 100000"},
    }
    assert limits.values(0, unified=False)["cpu"]["cpu.cfs_quota_us"] == "250000"


def test_v1_hierarchies_are_found_from_mountinfo_and_the_process_cgroup(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
        "35 31 0:32 /kubepods /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    )
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/kubepods/pod1/c2\n2:cpu,cpuacct:/\n0::/\n")
    found = v1_hierarchies(mountinfo, proc)
    assert found["memory"] == Path("/sys/fs/cgroup/memory/pod1/c2")
    assert found["cpu"] == Path("/sys/fs/cgroup/cpu,cpuacct")
    assert v1_hierarchies(tmp_path / "absent", proc) == {}
