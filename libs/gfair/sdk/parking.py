"""Waiting, parked in place, for the executor's answer: resume here, or checkpoint and exit.

A parked job holds no GPU and does nothing until the executor answers. The answer is a file in
the control directory (`PARK_FILE`: `{"park": n, "action": "resume" | "exit"}`), written
atomically, followed by SIGUSR2 to the SDK's process. A resume of a prepared start (a process
started before it had GPUs) also carries `"env"`: the variables that name the GPUs it was given
(`CUDA_VISIBLE_DEVICES`), which the SDK sets before the job touches a GPU. The wait blocks in
`select` on a pipe that Python's signal machinery writes to (`signal.set_wakeup_fd`), so the
signal wakes it whichever thread the kernel delivered it to; a timeout re-reads the file now and
then, in case a signal was lost. Off the main thread (no handler can be installed) it polls the
file.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Literal

Action = Literal["resume", "exit"]
# A signal the executor sends only to a process that said it is parked.
ANSWER_SIGNAL = signal.SIGUSR2


def read_answer(path: Path, park: int) -> Action | None:
    """The executor's answer to park number `park`, or None (none yet, or for another park)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("park") != park:
        return None
    action = data.get("action")
    if action == "resume":
        return "resume"
    if action == "exit":
        return "exit"
    return None


def granted_environment(path: Path, park: int) -> dict[str, str]:
    """The variables the executor's "resume" of park `park` sets (empty when it sets none)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("park") != park:
        return {}
    env = data.get("env")
    if not isinstance(env, dict):
        return {}
    return {str(k): str(v) for k, v in env.items() if isinstance(k, str) and isinstance(v, str)}


def wait_for_answer(path: Path, park: int, *, recheck_s: float = 1.0) -> Action:
    """Block until the executor answers park number `park`."""
    if threading.current_thread() is not threading.main_thread():
        return _poll(path, park, interval_s=0.05)
    reader, writer = os.pipe()
    os.set_blocking(writer, False)
    os.set_blocking(reader, False)
    woken = threading.Event()

    def on_answer(signum: int, frame: FrameType | None) -> None:
        woken.set()

    previous_handler = signal.signal(ANSWER_SIGNAL, on_answer)
    previous_fd = signal.set_wakeup_fd(writer, warn_on_full_buffer=False)
    try:
        while True:
            answer = read_answer(path, park)
            if answer is not None:
                return answer
            select.select([reader], [], [], recheck_s)
            with contextlib.suppress(BlockingIOError):
                os.read(reader, 512)
    finally:
        signal.set_wakeup_fd(previous_fd)
        # Ignored from here on: a late duplicate answer must not kill the process (the
        # default action of SIGUSR2 is to terminate).
        restored = previous_handler if callable(previous_handler) else signal.SIG_IGN
        signal.signal(ANSWER_SIGNAL, restored)
        os.close(reader)
        os.close(writer)


def ignore_late_answers() -> None:
    """Ignore the answer signal from now on unless something handles it already, as
    `wait_for_answer` does after a park; for a framework that saves the process's handlers
    before training and puts them back after it (Lightning does), which would otherwise bring
    back the default action, termination, for a late duplicate answer as the job exits."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(ANSWER_SIGNAL) in (signal.SIG_DFL, None):
        signal.signal(ANSWER_SIGNAL, signal.SIG_IGN)


def _poll(path: Path, park: int, *, interval_s: float) -> Action:
    stop = threading.Event()
    while True:
        answer = read_answer(path, park)
        if answer is not None:
            return answer
        stop.wait(interval_s)
