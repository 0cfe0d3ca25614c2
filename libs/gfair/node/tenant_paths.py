"""Directories root makes, opens and gives away where a tenant's job can write: no link followed.

The executor runs as root, and a job's account owns its tenant's checkpoint root, so every name
in it. A job can put a symbolic link there where root is about to make the next job's checkpoint
directory (``ln -s /venv/site-packages $GFAIR_CHECKPOINT_DIR/../next``), or swap its own
directory for one before it dies, and root's ``mkdir``, ``chown`` and ``chmod`` follow links: the
target would become the tenant's. So root opens such a directory by its last name only, relative
to a parent the tenant cannot swap (root's, or itself opened this way), without following a link;
it must be a directory owned by root or by the job's account; it is given away through its
descriptor (``fchown``, ``fchmod``), and what root does in it is relative to that descriptor.
Anything else is `NotOwnFile` (its message says why: the job's start is refused), and the link's
target is never touched. The run tree is root's, and is made the same way all the same: a link
found there, however it came, is refused rather than followed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Collection, Iterator
from pathlib import Path

from gfair.node.job_account import JobAccount
from gfair.node.job_files import NotOwnFile

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_JOB_MODE = 0o700

# A directory to work in: a path trusted as it is (root's own, or the operator's), or the
# descriptor of one opened here.
Parent = Path | int


def owners(account: JobAccount | None) -> frozenset[int]:
    """Who may own a directory root makes for `account`'s jobs: root (made, not yet given away)
    and the account."""
    return frozenset({os.geteuid()} | ({account.uid} if account is not None else set()))


@contextlib.contextmanager
def opened(parent: Parent, name: str, allowed: Collection[int] | None) -> Iterator[int]:
    """The descriptor of directory `name` in `parent` (a link there is not followed), owned by
    one of `allowed` (None: anyone); `NotOwnFile` if it is anything else."""
    where = _where(parent, name)
    try:
        fd = os.open(where, _DIRECTORY, dir_fd=_dir_fd(parent))
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotOwnFile(f"{_shown(parent, name)} {_what(parent, name)}") from None
        raise
    try:
        uid = os.fstat(fd).st_uid
        if allowed is not None and uid not in allowed:
            raise NotOwnFile(
                f"{_shown(parent, name)} belongs to uid {uid}, neither root's nor the job's"
            )
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def made(
    parent: Parent,
    name: str,
    *,
    mode: int | None = None,
    owner: JobAccount | None = None,
    exclusive: bool = False,
) -> Iterator[int]:
    """`opened`, made first if missing (`FileExistsError` if it exists and `exclusive`), then
    given to `owner` (None: it stays root's) with `mode` (None: as made under the umask)."""
    try:
        os.mkdir(_where(parent, name), 0o700, dir_fd=_dir_fd(parent))
    except FileExistsError:
        if exclusive:
            raise
    with opened(parent, name, owners(owner)) as fd:
        if owner is not None:
            os.fchown(fd, owner.uid, owner.gid)
        if mode is not None:
            os.fchmod(fd, mode)
        yield fd


def make_job_directory(parent: Parent, name: str, account: JobAccount | None) -> None:
    """A directory of `account`'s jobs, made if missing: the account's alone (mode 0700)."""
    mode = None if account is None else _JOB_MODE
    with made(parent, name, mode=mode, owner=account):
        pass


def remove_in(directory: Path, name: str, allowed: Collection[int] | None) -> None:
    """Remove file `name` from `directory`, whose last component is not followed (see
    `opened`); nothing if it is missing."""
    with (
        opened(directory.parent, directory.name, allowed) as fd,
        contextlib.suppress(FileNotFoundError),
    ):
        os.unlink(name, dir_fd=fd)


def exists_in(directory: Path, name: str) -> bool:
    """Whether `name` is in `directory` (its last component not followed: not through a link)."""
    try:
        with opened(directory.parent, directory.name, None) as fd:
            os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def _where(parent: Parent, name: str) -> str | Path:
    if os.sep in name or name in ("", ".", ".."):
        raise NotOwnFile(f"{name!r} is not a name in a directory")
    return name if isinstance(parent, int) else parent / name


def _dir_fd(parent: Parent) -> int | None:
    return parent if isinstance(parent, int) else None


def _shown(parent: Parent, name: str) -> str:
    return name if isinstance(parent, int) else str(parent / name)


def _what(parent: Parent, name: str) -> str:
    try:
        mode = os.stat(_where(parent, name), dir_fd=_dir_fd(parent), follow_symlinks=False).st_mode
    except OSError:
        return "is not a directory"
    return "is a symbolic link" if stat.S_ISLNK(mode) else "is not a directory"


def remove_owned(directory: Path, uid: int) -> int:
    """Remove what `uid` left at the top of a shared directory (``/tmp``, ``/var/tmp``), links
    unfollowed (a directory through descriptors, `shutil.rmtree`); how many entries went.
    Called once none of the account's processes is left to race it."""
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed += 1
        except OSError:
            continue  # gone meanwhile, or swapped for something rmtree will not follow
    return removed
