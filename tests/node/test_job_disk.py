"""A job's disk use against its cap (issue 41: no disk quota, run directories never cleaned)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gfair.core.failure import ExitFacts, FailureClass, classify
from gfair.node.job_disk import disk_overrun
from gfair.node.supervisor import JobSupervisor
from node.helpers import JOB_PYTHON, make_config, synthetic

MIB = 1 << 20


def test_what_a_tree_holds_is_measured_by_its_blocks_without_following_links(
    tmp_path: Path,
) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "data").write_bytes(b"x" * (2 * MIB))
    assert disk_overrun(tmp_path, 4 * MIB) is None
    assert disk_overrun(tmp_path, MIB) == "went over its disk cap of 1 MiB"
    # A sparse file counts what it wrote; a link, nothing of its target.
    with open(tmp_path / "sparse", "wb") as sparse:
        sparse.truncate(1 << 40)
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "big").write_bytes(b"y" * (8 * MIB))
    (tmp_path / "link").symlink_to(outside, target_is_directory=True)
    assert disk_overrun(tmp_path, 4 * MIB) is None


def test_too_many_names_are_over_the_cap_however_small(tmp_path: Path) -> None:
    for index in range(20):
        (tmp_path / str(index)).touch()
    assert disk_overrun(tmp_path, MIB, max_entries=50) is None
    assert disk_overrun(tmp_path, MIB, max_entries=10) == (
        "made more files than its disk cap allows (10)"
    )


async def test_a_job_that_fills_its_run_directory_is_killed_as_its_own_failure(
    tmp_path: Path,
) -> None:
    fill = (
        "import os, time\n"
        "with open('fill', 'wb') as out:\n"
        "    for _ in range(64):\n"
        "        out.write(os.urandom(1 << 20)); out.flush(); time.sleep(0.05)\n"
        "time.sleep(60)\n"
    )
    config = make_config(tmp_path, disk_max_bytes=8 * MIB, disk_check_s=0.2)
    async with JobSupervisor(config) as supervisor:
        launch = dataclasses.replace(
            synthetic("filler", (0,), "v100"), argv=(JOB_PYTHON, "-c", fill)
        )
        job = await supervisor.start(launch)
        exited = await supervisor.wait("filler")
    assert "went over its disk cap of 8 MiB" in exited.stderr_tail
    assert (job.paths.workdir / "fill").stat().st_size < 64 * MIB
    verdict = classify(
        ExitFacts(exit_code=exited.exit_code, signal=exited.signal, stderr_tail=exited.stderr_tail)
    )
    assert verdict.kind is FailureClass.USER_ERROR, verdict
