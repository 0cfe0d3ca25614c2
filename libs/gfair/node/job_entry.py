"""The entry of a job: what runs between the executor's fork and the job's own program.

The executor (root) starts this file as a script, ``python -I -S job_entry.py``, with an empty
environment: isolated mode and no ``site`` make nothing of the tenant's (``LD_*``, ``PYTHON*``, a
``.pth`` file) reach this root process, which reads the job's `Entry` (JSON) from its stdin and,
in this order:

1. moves itself into the job's cgroups (v2 and every v1 one of its limits and devices), so that
   nothing the job runs, a dynamic loader's ``LD_PRELOAD`` constructor included, is ever
   outside them;
2. as root, enters a mount namespace of its own with a fresh ``/dev/shm`` and a fresh
   ``TMPDIR``, tmpfs whose pages are charged to the job's memory cgroup and which go with the
   namespace when its last process ends (nothing a job left there outlives it), and a ``/proc``
   that shows the job its own account's processes only (``hidepid``);
3. becomes the job's account, and execs the job's program with the job's environment.

It imports the standard library only: it runs before any of gfair's packages could be trusted
to be on its path. What failed before the exec is written to the report descriptor (closed by
the exec itself on success), which `gfair.node.job_sandbox` raises as the start's error.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from typing import TypedDict

_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000


class Entry(TypedDict):
    argv: list[str]
    env: dict[str, str]
    cwd: str
    cgroups: list[str]  # cgroup directories to enter
    uid: int | None  # None: stay the executor's own account (it is not root)
    gid: int | None
    # Where the job's private tmpfs go (its /dev/shm, its TMPDIR); None: no namespace of its own.
    tmpfs: list[str] | None
    tmpfs_size: int | None  # bytes per tmpfs; None: the kernel's default (half the memory)
    report_fd: int


def _libc_call(libc: ctypes.CDLL, name: str, *args: object) -> None:
    if getattr(libc, name)(*args) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{name}: {os.strerror(number)}")


def _private_mounts(targets: list[str], size: int | None, uid: int | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        _libc_call(libc, "unshare", _CLONE_NEWNS)
    except PermissionError:
        # A host (a container without CAP_SYS_ADMIN) that refuses mount namespaces still runs
        # jobs, with the node's own /dev/shm and /proc; the job's stderr says so.
        _say("no mount namespace of its own on this node (refused): shared /dev/shm and /proc")
        return
    # Private first: a mount made here must never propagate back to the host's namespace.
    _libc_call(libc, "mount", None, b"/", None, _MS_REC | _MS_PRIVATE, None)
    options = "mode=1777" + ("" if size is None else f",size={size}")
    if uid is not None:
        options += f",uid={uid}"
    for target in targets:
        _libc_call(
            libc, "mount", b"tmpfs", target.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
            options.encode(),
        )  # fmt: skip
    # A /proc of its own that shows the job only its own account's processes: another
    # tenant's argv, environment size and open files are none of its business (hidepid).
    try:
        _libc_call(
            libc, "mount", b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
            b"hidepid=invisible",
        )  # fmt: skip
    except OSError as error:  # a container's /proc may be locked: the job still runs
        _say(f"every process of the node stays visible in /proc ({error.strerror})")


def _say(what: str) -> None:
    os.write(2, f"gfair: {what}\n".encode())


def enter(entry: Entry) -> None:
    """Everything up to the job's exec (module doc); raises `OSError` where a step fails."""
    for path in entry["cgroups"]:
        with open(os.path.join(path, "cgroup.procs"), "w") as procs:
            procs.write(f"{os.getpid()}\n")
    if entry["tmpfs"] is not None:
        _private_mounts(entry["tmpfs"], entry["tmpfs_size"], entry["uid"])
    uid, gid = entry["uid"], entry["gid"]
    if gid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
    if uid is not None:
        os.setresuid(uid, uid, uid)
    os.chdir(entry["cwd"])
    # Python ignores these at start; an ignored signal stays ignored across exec.
    for number in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(number, signal.SIG_DFL)
    os.execvpe(entry["argv"][0], entry["argv"], entry["env"])


def main() -> None:
    entry: Entry = json.loads(sys.stdin.buffer.read())
    report = entry["report_fd"]
    os.set_inheritable(report, False)  # the exec closes it: the executor reads that as success
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        enter(entry)
    except OSError as error:
        reason = error.strerror or str(error)
        what = error.filename or entry["argv"][0]
        os.write(report, json.dumps([error.errno or 0, reason, str(what)]).encode())
    os._exit(127)


if __name__ == "__main__":
    main()
