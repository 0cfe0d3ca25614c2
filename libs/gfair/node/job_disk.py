"""What a job keeps on its node's disk, measured against its cap (`GFAIR_JOB_DISK_MAX_BYTES`).

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
