"""The control-plane services on a real nats-server, in-process, for client and CLI tests.

Placement admits, split-stride places (the decision kernel), the trading auction computes
shares, the failure detector keeps node records and the profiler is there because every real
cluster has one; nodes are announced
by publishing their registrations (no node executor: these tests exercise the request paths of
tools, not running jobs, so registrations promise a heartbeat only every minute).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.publisher import EventPublisher
from gfair.bus.runner import RunnerSettings
from gfair.bus.runtime import ServiceRuntime
from gfair.events.nodes import NodeRegistered
from gfair_services import failure_detector, placement, profiler, split_stride, trading_auction
from services.scheduling_harness import registered

FAST = RunnerSettings(batch=20, fetch_timeout_s=0.05, error_pause_s=0.05)


def registration(node_id: str, generation: str, gpus: int = 4) -> NodeRegistered:
    return registered(node_id, generation, gpus, heartbeat_interval_s=60.0)


@asynccontextmanager
async def control_plane(url: str, *nodes: NodeRegistered) -> AsyncIterator[NatsBus]:
    """The control-plane services running on `url`, with `nodes` registered."""
    bus = await NatsBus.connect(NatsOptions(servers=(url,), name="test-services"))
    runtimes = [
        ServiceRuntime(placement.build_service(placement.Settings()), bus, settings=FAST),
        ServiceRuntime(split_stride.build_service(split_stride.Settings()), bus, settings=FAST),
        ServiceRuntime(
            trading_auction.build_service(trading_auction.Settings(recompute_interval_s=0.1)),
            bus,
            settings=FAST,
        ),
        ServiceRuntime(profiler.build_service(profiler.Settings()), bus, settings=FAST),
        ServiceRuntime(
            failure_detector.build_service(failure_detector.Settings()), bus, settings=FAST
        ),
    ]
    try:
        for runtime in runtimes:
            await runtime.start()
        tool = EventPublisher(bus, "test-node")
        for node in nodes:
            await tool.publish(node)
        yield bus
    finally:
        for runtime in runtimes:
            await runtime.stop()
        await bus.close()


@contextmanager
def control_plane_thread(url: str, *nodes: NodeRegistered) -> Iterator[None]:
    """`control_plane` on an event loop of its own, for tests that call `asyncio.run` (CLI)."""
    started = threading.Event()
    stop: asyncio.Event | None = None
    loop = asyncio.new_event_loop()
    failure: list[BaseException] = []

    async def serve() -> None:
        nonlocal stop
        stop = asyncio.Event()
        try:
            async with control_plane(url, *nodes):
                started.set()
                await stop.wait()
        except BaseException as exc:
            failure.append(exc)
            started.set()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        if not started.wait(30) or failure:
            raise RuntimeError(f"control plane did not start: {failure}")
        yield
    finally:
        if stop is not None:
            loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()
