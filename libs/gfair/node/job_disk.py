"""What a job keeps on its node's disk: its output files, cut back to their cap
(`GFAIR_JOB_OUTPUT_MAX_BYTES`) and a note saying so, and the whole of its run directory,
measured against its cap (`GFAIR_JOB_DISK_MAX_BYTES`).

The walk counts the blocks each file really holds (a sparse file counts what it wrote), never
follows a link, and stops early: past the cap in bytes, or past `MAX_ENTRIES` names, which is
a cap of its own (a job that makes millions of empty files fills the inode table, and would
make every measurement slow).
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_ENTRIES = 200_000
_BLOCK = 512  # st_blocks' unit
# What a run's stdout.log or stderr.log keeps (and ships) at most; then `capped_note` ends it.
OUTPUT_MAX_BYTES = 64 << 20


def capped_note(output: str, max_bytes: int) -> bytes:
    """What ends an output cut at its cap of `max_bytes`."""
    return (
        f"\ngfair: this run's {output} went over its cap of {max_bytes} bytes "
        "(GFAIR_JOB_OUTPUT_MAX_BYTES); what it wrote after that is not kept\n"
    ).encode()


def cap_output(path: Path, output: str, max_bytes: int) -> bool:
    """Cut the output at `path` back to its first `max_bytes` and the note; whether it was
    over. The job appends (O_APPEND), so what it writes next lands after the note, to be cut
    the next time; the file is the executor's (0600), never a link."""
    note = capped_note(output, max_bytes)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        if os.fstat(fd).st_size <= max_bytes + len(note):
            return False
        os.pwrite(fd, note, max_bytes)
        os.ftruncate(fd, max_bytes + len(note))
        return True
    finally:
        os.close(fd)


def cap_outputs(run_dir: Path, max_bytes: int) -> list[str]:
    """`cap_output` for both outputs of the run in `run_dir` (`RunDirectory.stdout`,
    `.stderr`); those that were over."""
    return [o for o in ("stdout", "stderr") if cap_output(run_dir / f"{o}.log", o, max_bytes)]


def disk_overrun(root: Path, cap: int, max_entries: int = MAX_ENTRIES) -> str | None:
    """None while `root` holds at most `cap` bytes in at most `max_entries` names; else what
    it went over, said for the job's stderr ("went over its disk cap of ...")."""
    used, entries = 0, 0
    pending = [str(root)]
    while pending:
        try:
            scanner = os.scandir(pending.pop())
        except OSError:
            continue  # gone meanwhile, or not readable: nothing of it to count
        with scanner:
            for entry in scanner:
                entries += 1
                if entries > max_entries:
                    return f"made more files than its disk cap allows ({max_entries:,})"
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                used += info.st_blocks * _BLOCK
                if used > cap:
                    return f"went over its disk cap of {_size(cap)}"
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
    return None


def _size(count: int) -> str:
    return f"{count / (1 << 30):.3g} GiB" if count >= 1 << 30 else f"{count / (1 << 20):.3g} MiB"
