"""Classifying how a job ended (docs/design.md §2.6, after the Philly analysis).

Classes: success; user error (the program failed on its own: non-zero exit, a crash signal);
out-of-memory (GPU or host); infrastructure (node lost, executor crash, a hardware NVML XID,
NCCL/network/storage trouble); preempted (the scheduler suspended or killed it on purpose).

Facts are checked strongest first, and the first rule that matches decides:

1. the scheduler asked the job to stop -> preempted;
2. the node was lost, or the executor crashed -> infrastructure;
3. an NVML XID from `INFRASTRUCTURE_XIDS` on the job's GPUs -> infrastructure (XIDs such as 13,
   31 or 43 follow from what the program did and are left to the rules below);
4. exit code 0 and no signal -> success;
5. the stderr tail matches an out-of-memory pattern -> out-of-memory;
6. the stderr tail matches an infrastructure pattern (NCCL, ECC, "Xid", I/O errors...) ->
   infrastructure;
7. killed by SIGKILL/SIGTERM nobody asked for -> infrastructure (the node or an operator took it);
8. anything else (non-zero exit, SIGSEGV, SIGABRT...) -> user error.
"""

from __future__ import annotations

import re
import signal as signals
from dataclasses import dataclass
from enum import StrEnum


class FailureClass(StrEnum):
    """How a job run ended (docs/design.md §2.6); the failure policy retries by class."""

    SUCCESS = "success"
    # Non-zero exit of the program itself: deterministic, retried at most once.
    USER_ERROR = "user_error"
    OUT_OF_MEMORY = "out_of_memory"
    # Node lost, GPU error (NVML XID), executor crash: resumes from checkpoint elsewhere.
    INFRASTRUCTURE = "infrastructure"
    PREEMPTED = "preempted"
    # Its user cancelled it: a job's end, never the outcome of classifying an exit.
    CANCELLED = "cancelled"
    # Its running time passed its time limit (`JobLaunch.time_limit`): stopped by split-stride.
    TIME_LIMIT = "time_limit"


# XIDs NVIDIA documents as hardware, driver or interconnect faults, with their meaning.
INFRASTRUCTURE_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping",
    64: "ECC page retirement or row remapper failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}

OUT_OF_MEMORY_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE))
    for name, pattern in (
        ("CUDA out of memory", r"CUDA out of memory|CUDA error: out of memory"),
        ("torch OutOfMemoryError", r"OutOfMemoryError"),
        ("cudaErrorMemoryAllocation", r"cudaErrorMemoryAllocation"),
        ("TensorFlow OOM", r"ResourceExhaustedError|OOM when allocating"),
        ("host MemoryError", r"\bMemoryError\b"),
        ("memory limit", r"over its memory limit"),  # the node executor's note (job_limits)
    )
)

# The node executor's notes of a limit the job itself went over (`gfair.node.job_disk`): its own
# doing, not the node's, though it ends with a SIGKILL; another node would see the same.
USER_LIMIT_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("disk cap", re.compile(r"over its disk cap|more files than its disk cap")),
)

INFRASTRUCTURE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE))
    for name, pattern in (
        ("NVML Xid", r"\bXid\b"),
        ("NCCL error", r"NCCL (error|WARN)|ncclSystemError|ncclRemoteError|ncclInternalError"),
        ("ECC error", r"uncorrectable ECC|ECC error"),
        ("GPU lost", r"GPU is lost|fallen off the bus|no CUDA-capable device is detected"),
        ("network", r"Connection reset by peer|Connection refused|No route to host"),
        ("storage", r"Input/output error|Stale file handle|No space left on device"),
        # The node executor's words where its Docker engine is down (`gfair.node.container_jobs`).
        ("container engine", r"the container engine is unreachable"),
    )
)

_CRASH_SIGNALS = {signals.SIGKILL, signals.SIGTERM}


@dataclass(frozen=True)
class ExitFacts:
    """What is known about how a job process ended."""

    exit_code: int | None = None
    signal: int | None = None  # the signal that ended the process, if any
    stderr_tail: str = ""
    xids: tuple[int, ...] = ()  # NVML XID events on the job's GPUs while it ran
    node_lost: bool = False
    executor_crashed: bool = False
    requested_stop: bool = False  # the scheduler suspended, migrated or preempted it


@dataclass(frozen=True)
class Classification:
    kind: FailureClass
    reason: str
    rule: str  # which rule decided (see the module doc)


def classify(facts: ExitFacts) -> Classification:
    if facts.requested_stop:
        return Classification(FailureClass.PREEMPTED, "stopped by the scheduler", "requested-stop")
    if facts.node_lost:
        return Classification(FailureClass.INFRASTRUCTURE, "node lost", "node-lost")
    if facts.executor_crashed:
        return Classification(FailureClass.INFRASTRUCTURE, "node executor crashed", "executor")
    for xid in facts.xids:
        if xid in INFRASTRUCTURE_XIDS:
            reason = f"NVML XID {xid} ({INFRASTRUCTURE_XIDS[xid]})"
            return Classification(FailureClass.INFRASTRUCTURE, reason, "xid")
    if facts.exit_code == 0 and facts.signal is None:
        return Classification(FailureClass.SUCCESS, "exited 0", "exit-code")
    for name, pattern in OUT_OF_MEMORY_PATTERNS:
        line = _matching_line(pattern, facts.stderr_tail)
        if line is not None:
            return Classification(FailureClass.OUT_OF_MEMORY, f"{name}: {line}", "stderr")
    for name, pattern in USER_LIMIT_PATTERNS:
        line = _matching_line(pattern, facts.stderr_tail)
        if line is not None:
            return Classification(FailureClass.USER_ERROR, f"{name}: {line}", "stderr")
    for name, pattern in INFRASTRUCTURE_PATTERNS:
        line = _matching_line(pattern, facts.stderr_tail)
        if line is not None:
            return Classification(FailureClass.INFRASTRUCTURE, f"{name}: {line}", "stderr")
    if facts.signal in _CRASH_SIGNALS:
        reason = f"killed by {_signal_name(facts.signal)} nobody asked for"
        return Classification(FailureClass.INFRASTRUCTURE, reason, "signal")
    if facts.signal is not None:
        reason = f"crashed with {_signal_name(facts.signal)}{_last_line(facts.stderr_tail)}"
        return Classification(FailureClass.USER_ERROR, reason, "signal")
    code = "unknown" if facts.exit_code is None else str(facts.exit_code)
    reason = f"exit code {code}{_last_line(facts.stderr_tail)}"
    return Classification(FailureClass.USER_ERROR, reason, "exit-code")


def _matching_line(pattern: re.Pattern[str], text: str) -> str | None:
    for line in reversed(text.splitlines()):
        if pattern.search(line):
            return line.strip()[:200]
    return None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f": {lines[-1][:200]}" if lines else ""


def _signal_name(number: int | None) -> str:
    if number is None:
        return "no signal"
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"
