"""Periodic GPU telemetry as an async stream, for the node executor to publish."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Set
from dataclasses import dataclass

import anyio
import anyio.to_thread

from gfair.node.gpu import GpuBackend, GpuReading, XidError


@dataclass(frozen=True, slots=True)
class TelemetryReport:
    time: float
    samples: tuple[GpuReading, ...]
    xid_errors: tuple[XidError, ...]


async def telemetry_reports(
    gpus: GpuBackend, *, interval_s: float, busy: Callable[[], Set[int]]
) -> AsyncIterator[TelemetryReport]:
    """Sample every `interval_s` (on a fixed schedule, so slow reads do not make it drift).

    `busy` tells which GPU indices run jobs right now (e.g. `JobSupervisor.busy_gpus`).
    """
    if interval_s <= 0:
        raise ValueError(f"interval_s must be positive, got {interval_s}")
    next_at = anyio.current_time()
    while True:
        in_use = frozenset(busy())
        # NVML calls can take milliseconds on a loaded driver: keep them off the event loop.
        samples, xids = await anyio.to_thread.run_sync(_read, gpus, in_use)
        yield TelemetryReport(time=time.time(), samples=tuple(samples), xid_errors=tuple(xids))
        next_at += interval_s
        now = anyio.current_time()
        if next_at < now:  # fell behind (suspended laptop, slow driver): do not burst
            next_at = now
        await anyio.sleep(next_at - now)


def _read(gpus: GpuBackend, busy: Set[int]) -> tuple[list[GpuReading], list[XidError]]:
    return gpus.sample(busy), gpus.poll_xid_errors()
