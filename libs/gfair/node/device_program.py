"""The device nodes a job's cgroup v2 lets it open: an eBPF program of type ``CGROUP_DEVICE``.

cgroup v2 has no ``devices`` controller: the kernel asks the eBPF programs attached to a
process's cgroup (and its ancestors') whether it may open, read, write or make a device node,
and refuses where one says no. A job's program allows the standard nodes any process needs and
its own GPUs' (`gfair.node.job_limits.device_rules`, the same ``devices.allow`` rules as on
cgroup v1) and nothing else, so a job that unsets ``CUDA_VISIBLE_DEVICES`` still opens no other
GPU of its node. It is attached to the job's cgroup before the job's first process enters it,
and replaced when the job moves to other GPUs (one program per cgroup: a new attach replaces
the last). It goes with the cgroup.

The program is a handful of instructions written here (no compiler, no library): for each rule,
compare the device's type, major and minor (``struct bpf_cgroup_dev_ctx``) and return 1 on a
match; return 0 at the end. It is loaded with the ``bpf`` system call through ctypes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
import struct
from collections.abc import Sequence
from pathlib import Path

_SYSCALL = {"x86_64": 321, "aarch64": 280}.get(platform.machine())
_PROG_LOAD, _PROG_ATTACH = 5, 8
_PROG_TYPE_CGROUP_DEVICE = 15
_ATTACH_CGROUP_DEVICE = 6
_ATTR_SIZE = 128
_DEVICE_TYPES = {"b": 1, "c": 2}  # BPF_DEVCG_DEV_BLOCK, BPF_DEVCG_DEV_CHAR
# struct bpf_cgroup_dev_ctx: access_type (access << 16 | type), major, minor; all u32.
_CTX_TYPE, _CTX_MAJOR, _CTX_MINOR = 0, 4, 8


class DeviceProgramError(OSError):
    """The kernel refused the program or its attachment; the message says which and why."""


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


_LOAD_WORD = 0x61  # BPF_LDX | BPF_MEM | BPF_W
_AND32_IMM = 0x54  # BPF_ALU | BPF_AND | BPF_K
_JNE_IMM = 0x55  # BPF_JMP | BPF_JNE | BPF_K
_MOV_IMM = 0xB7  # BPF_ALU64 | BPF_MOV | BPF_K
_EXIT = 0x95  # BPF_JMP | BPF_EXIT


def program(rules: Sequence[str]) -> bytes:
    """The instructions that allow exactly the devices of `rules` (``"c 195:0 rwm"``, a minor
    of ``*`` for any); every access to an allowed node is allowed (making one needs
    ``CAP_MKNOD``, which no job has)."""
    code = _insn(_LOAD_WORD, dst=2, src=1, off=_CTX_TYPE)
    code += _insn(_AND32_IMM, dst=2, imm=0xFFFF)
    code += _insn(_LOAD_WORD, dst=3, src=1, off=_CTX_MAJOR)
    code += _insn(_LOAD_WORD, dst=4, src=1, off=_CTX_MINOR)
    for rule in rules:
        checks = [(2, _DEVICE_TYPES[kind]) for kind in rule.split()[:1]]
        major, _, minor = rule.split()[1].partition(":")
        checks.append((3, int(major)))
        if minor != "*":
            checks.append((4, int(minor)))
        # Each check skips the rest of this rule on a mismatch: the later checks, then the
        # `r0 = 1; exit` that allows.
        for index, (register, value) in enumerate(checks):
            code += _insn(_JNE_IMM, dst=register, off=len(checks) - index + 1, imm=value)
        code += _insn(_MOV_IMM, dst=0, imm=1) + _insn(_EXIT)
    return code + _insn(_MOV_IMM, dst=0, imm=0) + _insn(_EXIT)


def _bpf(command: int, attr: bytes) -> int:
    if _SYSCALL is None:
        raise DeviceProgramError(f"no bpf system call known for {platform.machine()}")
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    buffer = ctypes.create_string_buffer(attr.ljust(_ATTR_SIZE, b"\0"), _ATTR_SIZE)
    result = int(libc.syscall(_SYSCALL, command, buffer, _ATTR_SIZE))
    if result < 0:
        number = ctypes.get_errno()
        raise DeviceProgramError(number, os.strerror(number))
    return result


def load(rules: Sequence[str]) -> int:
    """The descriptor of the program for `rules`, loaded (its owner closes it)."""
    code = ctypes.create_string_buffer(program(rules))
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = struct.pack(
        "<IIQQIIQII16sII",
        _PROG_TYPE_CGROUP_DEVICE,
        len(code.raw) // 8,
        ctypes.addressof(code),
        ctypes.addressof(license_),
        0,  # no verifier log
        0,
        0,
        0,  # kernel version: unused for this type
        0,
        b"gfair_devices",
        0,
        _ATTACH_CGROUP_DEVICE,
    )
    try:
        return _bpf(_PROG_LOAD, attr)
    except DeviceProgramError as error:
        raise DeviceProgramError(
            error.errno, f"loading a device program: {error.strerror}"
        ) from None


def allow_only(cgroup: Path, rules: Sequence[str]) -> None:
    """Let the processes of `cgroup` (a cgroup v2 directory) open only the devices of `rules`;
    replaces the program an earlier call attached."""
    prog = load(rules)
    try:
        target = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            # Flags 0: one program on this cgroup, which a new attach replaces.
            _bpf(_PROG_ATTACH, struct.pack("<IIII", target, prog, _ATTACH_CGROUP_DEVICE, 0))
        except DeviceProgramError as error:
            raise DeviceProgramError(
                error.errno, f"attaching a device program to {cgroup}: {error.strerror}"
            ) from None
        finally:
            os.close(target)
    finally:
        os.close(prog)  # the attachment holds the program


@functools.cache
def available() -> bool:
    """Whether this host lets the executor load device programs (root, a kernel with eBPF
    cgroup programs, no seccomp filter refusing ``bpf``); asked once a process."""
    try:
        os.close(load(()))
    except DeviceProgramError:
        return False
    return True
