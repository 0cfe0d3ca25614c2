"""What a job hands the executor through the filesystem, taken only if it is the job's own.

The executor runs as root and reads files in directories the job owns: its progress file and
its checkpoints. A job can put a symbolic link there (or name any path in a report), and root
follows links wherever they point: into another tenant's progress file (fake steps that cut that
tenant's measured speed-up) or checkpoints (another job's step published as this one's). So a
progress file is opened without following a link and must be a regular file owned by the job's
account, and a checkpoint counts only if its real path lies in the job's own checkpoint
directory, itself no link, and belongs to the job's account.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO


class NotOwnFile(OSError):
    """A file the job named or left is not its own (a link, or another account's)."""


def open_own(path: Path, owner: int | None) -> BinaryIO:
    """Open `path` for reading if it is a regular file (not a link) owned by `owner` (None: any
    owner); `FileNotFoundError` while it does not exist, `NotOwnFile` if it is not the job's."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:  # the last component is a symbolic link
            raise NotOwnFile(f"{path} is a symbolic link") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotOwnFile(f"{path} is not a regular file")
        if owner is not None and info.st_uid != owner:
            raise NotOwnFile(f"{path} belongs to uid {info.st_uid}, not the job's {owner}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def own_checkpoint(path: Path, checkpoint_dir: Path, owner: int | None) -> str | None:
    """None if `path` is a checkpoint of the job whose checkpoint directory is `checkpoint_dir`
    (owned by `owner`, None: any owner); else why it is not."""
    directory = checkpoint_dir.absolute()
    try:
        if directory.is_symlink():
            return f"the job's checkpoint directory {directory} is a symbolic link"
        real_dir = directory.resolve(strict=True)
        real = Path(path).absolute().resolve(strict=True)
        info = real.stat()
    except (OSError, RuntimeError) as error:
        return f"{path} cannot be resolved: {error}"
    if real.parent != real_dir:
        return f"{path} lies outside the job's checkpoint directory {directory}"
    if owner is not None and info.st_uid != owner:
        return f"{path} belongs to uid {info.st_uid}, not the job's {owner}"
    return None
