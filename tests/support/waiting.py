"""Waiting on conditions instead of sleeping: the only place tests pause.

`eventually` polls until a check holds and returns what it gave; `consistently` checks that a
condition holds for a whole window (for "nothing happens" assertions, where there is no event to
wait for): it fails at the first poll that sees the condition broken, not only at the end.
Checks may be plain functions or coroutine functions; the `_sync` forms are for tests without an
event loop (a CLI command in a thread, a file a subprocess writes).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class _Window:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def met(self, result: object, what: str) -> bool:
        """For `eventually`: whether `result` ends the wait; fails once the window is over."""
        if result:
            return True
        if time.monotonic() > self.end:
            raise AssertionError(f"{what} not met within {self.seconds}s (last: {result!r})")
        return False

    def held(self, result: object, what: str) -> bool:
        """For `consistently`: fails on a false `result`; whether the window is over."""
        if not result:
            raise AssertionError(f"{what} broke within {self.seconds}s (got {result!r})")
        return time.monotonic() > self.end


async def _value(check: Callable[[], T | Awaitable[T]]) -> T:
    result = check()
    if inspect.isawaitable(result):
        return await result
    return result


async def eventually(
    check: Callable[[], T | Awaitable[T]],
    timeout_s: float = 10.0,
    interval_s: float = 0.01,
    what: str = "check",
) -> T:
    """Poll `check` until it returns something true; return that, or fail after `timeout_s`."""
    window = _Window(timeout_s)
    while True:  # a poll: the code under test has no event to wait on
        if window.met(result := await _value(check), what):
            return result
        await asyncio.sleep(interval_s)


def eventually_sync(
    check: Callable[[], T], timeout_s: float = 10.0, interval_s: float = 0.02, what: str = "check"
) -> T:
    window = _Window(timeout_s)
    while not window.met(result := check(), what):
        time.sleep(interval_s)
    return result


async def consistently(
    check: Callable[[], object], for_s: float, interval_s: float = 0.01, what: str = "check"
) -> None:
    """Check that `check` holds on every poll for `for_s` seconds: what "nothing happens" means.

    There is no event to await for an absence, so this window is the one pause that stays."""
    window = _Window(for_s)
    while True:
        if window.held(await _value(check), what):
            return
        await asyncio.sleep(interval_s)


def consistently_sync(check: Callable[[], object], for_s: float, interval_s: float = 0.02) -> None:
    window = _Window(for_s)
    while not window.held(check(), "check"):
        time.sleep(interval_s)
