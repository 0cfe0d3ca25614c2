"""How the executor starts a job's process: through `gfair.node.job_entry`, a root process with
an empty environment that enters the job's cgroups, gives it a private ``/dev/shm`` and
``TMPDIR``, drops to its account and only then execs its program with its environment.

No code of the tenant's runs before the process is in every cgroup of the job, and none of its
environment (``LD_PRELOAD``, ``LD_LIBRARY_PATH``, ``PYTHON*``) reaches a program root runs. A
start that fails in the entry (a program that cannot run, a cgroup that refused it) fails the
start with the entry's error, as a failed exec does.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.abc

from gfair.node.job_account import JobAccount
from gfair.node.job_cgroup import JobCgroup
from gfair.node.job_entry import Entry
from gfair.node.job_limits import JobLimitGroups

ENTRY_SCRIPT = Path(__file__).with_name("job_entry.py")
_SHM = "/dev/shm"
TMP_NAME = "tmp"  # the job's TMPDIR, under its run directory (a tmpfs in its namespace only)


async def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    run_dir: Path,
    *,
    cgroup: JobCgroup | None,
    limits: JobLimitGroups | None,
    account: JobAccount | None,
    stdout: IO[Any],
    stderr: IO[Any],
) -> anyio.abc.Process:
    """Start `argv` as the job's process (module doc); `OSError` where it could not start."""
    cgroups = [] if cgroup is None else [str(cgroup.path)]
    if limits is not None:
        cgroups += [str(path) for path in limits.legacy.values()]
    environment = dict(env)
    tmpfs: list[str] | None = None
    if account is not None:  # a root executor: the mounts need it
        tmp = run_dir / TMP_NAME
        tmp.mkdir(mode=0o755, exist_ok=True)
        tmpfs = [_SHM, str(tmp)]
        environment["TMPDIR"] = str(tmp)
    read_end, write_end = os.pipe()
    entry = Entry(
        argv=list(argv),
        env=environment,
        cwd=str(cwd),
        cgroups=cgroups,
        uid=None if account is None else account.uid,
        gid=None if account is None else account.gid,
        tmpfs=tmpfs,
        tmpfs_size=None if limits is None else limits.memory,
        report_fd=write_end,  # pass_fds keeps its number
    )
    try:
        try:
            process = await anyio.open_process(
                [sys.executable, "-I", "-S", str(ENTRY_SCRIPT)],
                stdin=subprocess.PIPE,
                stdout=stdout,
                stderr=stderr,
                cwd="/",
                env={},
                start_new_session=True,
                pass_fds=(write_end,),
            )
        finally:
            os.close(write_end)
        try:
            assert process.stdin is not None
            await process.stdin.send(json.dumps(entry).encode())
            await process.stdin.aclose()
            report = await anyio.to_thread.run_sync(_read_to_end, read_end)
        except BaseException:
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
            raise
    finally:
        os.close(read_end)
    if report:
        await process.wait()
        number, reason, what = json.loads(report)
        raise OSError(number, reason, what)
    return process


def _read_to_end(fd: int) -> bytes:
    chunks: list[bytes] = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)
