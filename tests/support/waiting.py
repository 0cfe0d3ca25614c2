"""Waiting on conditions instead of sleeping: the only place tests pause.

`eventually` polls until a check holds and returns what it gave; `consistently` checks that a
condition holds for a whole window (for "nothing happens" assertions, where there is no event to
wait for). Checks may be plain functions or coroutine functions.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def _value(check: Callable[[], T | Awaitable[T]]) -> T:
    result = check()
    if inspect.isawaitable(result):
        return await result
    return result


async def eventually(
    check: Callable[[], T | Awaitable[T]],
    timeout_s: float = 10.0,
    interval_s: float = 0.01,
    what: str = "condition",
) -> T:
    """Poll `check` until it returns something true; return that, or fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = await _value(check)
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s}s (last: {result!r})")
        await asyncio.sleep(interval_s)


def eventually_sync(
    check: Callable[[], T],
    timeout_s: float = 10.0,
    interval_s: float = 0.02,
    what: str = "condition",
) -> T:
    """`eventually` for tests without an event loop (a CLI in a subprocess, a file written)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s}s (last: {result!r})")
        time.sleep(interval_s)


async def consistently(
    check: Callable[[], object],
    for_s: float,
    interval_s: float = 0.01,
    what: str = "condition",
) -> None:
    """Check that `check` holds on every poll for `for_s` seconds: what "nothing happens" means.

    There is no event to await for an absence, so this window is the one pause that stays; it
    fails at the first poll that sees the condition broken, not only at the end.
    """
    deadline = time.monotonic() + for_s
    while True:
        result = await _value(check)
        if not result:
            raise AssertionError(f"{what} broke within {for_s}s (got {result!r})")
        if time.monotonic() > deadline:
            return
        await asyncio.sleep(interval_s)


def consistently_sync(check: Callable[[], object], for_s: float, interval_s: float = 0.02) -> None:
    """`consistently` for tests without an event loop (a CLI command in a thread waiting on)."""
    deadline = time.monotonic() + for_s
    while True:
        if not (result := check()):
            raise AssertionError(f"condition broke within {for_s}s (got {result!r})")
        if time.monotonic() > deadline:
            return
        time.sleep(interval_s)
