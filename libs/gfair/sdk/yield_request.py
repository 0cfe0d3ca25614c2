"""How a job learns it must yield its GPUs: SIGUSR1, or a file in its control directory.

The signal handler only sets a flag; the training loop acts on it at its next mini-batch
boundary, where state is consistent and a checkpoint is cheap. The file is the fallback for
processes that cannot install a handler (not the main thread) or were signalled before the
handler existed; it is polled at most every `poll_interval_s` to keep `requested()` cheap.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


class YieldRequest:
    def __init__(
        self,
        yield_file: Path | None,
        *,
        install_handler: bool = True,
        poll_interval_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._yield_file = yield_file
        self._poll_interval_s = poll_interval_s
        self._clock = clock
        self._flag = False
        self._next_poll = float("-inf")
        self._previous: _Handler = None
        self.handles_sigusr1 = False
        if install_handler and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGUSR1, self._on_signal)
            self.handles_sigusr1 = True

    def requested(self) -> bool:
        if self._flag:
            return True
        if self._yield_file is not None:
            now = self._clock()
            if now >= self._next_poll:
                self._next_poll = now + self._poll_interval_s
                self._flag = self._yield_file.exists()
        return self._flag

    def park_allowed(self) -> bool:
        """Whether the executor lets this yield park in place (its yield file says so): a
        time slice that ends on this node may; a move, a drain or a memory shortage may not."""
        if self._yield_file is None:
            return False
        try:
            data = json.loads(self._yield_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and data.get("park") is True

    def withdraw(self) -> None:
        """The request was answered in place (the job resumed): forget it. The executor removed
        the file before it answered, so the next poll does not see this request again."""
        self._flag = False
        self._next_poll = float("-inf")

    def close(self) -> None:
        """Restore the SIGUSR1 handler that was there before; where that was the default, ignore
        the signal instead: a yield requested while the job winds down (after its last step,
        as the scheduler suspends it) must not kill it, and the default action would."""
        if self.handles_sigusr1:
            previous = self._previous
            if previous is None or previous == signal.SIG_DFL:
                previous = signal.SIG_IGN
            signal.signal(signal.SIGUSR1, previous)
            self.handles_sigusr1 = False

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._flag = True
        # Keep a handler the script (or its framework) installed before us working too.
        if callable(self._previous):
            self._previous(signum, frame)
