"""A route with lanes: each delivery waits for the earlier ones sharing a lane with it, runs
beside the others, and is settled (its outputs stored, then acknowledged) on its own."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

import pytest

from gfair.bus.publisher import EventPublisher
from gfair.bus.service import Emit, Service
from gfair.bus.transport import Bus
from gfair.events.envelope import Envelope
from support.waiting import consistently, eventually

from .events import STREAM, Pinged, Ponged
from .test_runtime import pings, runtime, stored


def _lane(envelope: Envelope, data: Pinged) -> list[Hashable] | None:
    """`a-1` is in lane `a`; `all-1` runs alone."""
    lane = data.key.split("-")[0]
    return None if lane == "all" else [lane]


class _Gates:
    """The handler waits at the gate of each key until the test opens it."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []
        self._gates: dict[str, asyncio.Event] = {}

    def gate(self, key: str) -> asyncio.Event:
        return self._gates.setdefault(key, asyncio.Event())

    def service(self) -> Service:
        service = Service("ponger")

        async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
            self.started.append(data.key)
            await self.gate(data.key).wait()
            self.finished.append(data.key)
            return [Emit(Ponged(key=data.key, count=data.count))]

        service.add_handler(on_ping, pings(ack_wait_s=5.0), lanes=_lane)
        return service


async def _publish(bus: Bus, *keys: str) -> None:
    tool = EventPublisher(bus, "tool")
    for count, key in enumerate(keys):
        await tool.publish(Pinged(key=key, count=count))


async def _pongs(bus: Bus) -> list[str]:
    return [p.data["key"] for p in await stored(bus, STREAM, "bustest.pong.")]


async def test_other_lanes_run_beside_a_held_one_and_a_lane_keeps_its_order(bus: Bus) -> None:
    gates = _Gates()
    running = runtime(gates.service(), bus)
    await running.prepare()
    await _publish(bus, "a-1", "b-1", "a-2", "c-1")
    async with running:
        gates.gate("b-1").set()
        gates.gate("c-1").set()
        gates.gate("a-2").set()  # open, but behind a-1 in its lane
        # b and c ran and were settled while a-1 still waits: their pongs are stored.
        await eventually(lambda: _has(bus, {"b-1", "c-1"}))
        assert gates.started == ["a-1", "b-1", "c-1"]
        assert "a-2" not in gates.started
        gates.gate("a-1").set()
        await eventually(lambda: _has(bus, {"a-1", "b-1", "a-2", "c-1"}))
    assert gates.finished.index("a-1") < gates.finished.index("a-2")
    pull = await bus.consume(pings(ack_wait_s=5.0))
    assert await pull.fetch(10, 0.5) == []  # every input acknowledged
    await pull.close()


async def test_a_delivery_without_lanes_runs_alone(bus: Bus) -> None:
    gates = _Gates()
    running = runtime(gates.service(), bus)
    await running.prepare()
    await _publish(bus, "a-1", "all-1", "b-1")
    async with running:
        gates.gate("all-1").set()
        gates.gate("b-1").set()
        await eventually(lambda: gates.started == ["a-1"])
        # all-1 waits for a-1, and b-1 for all-1
        await consistently(lambda: gates.started == ["a-1"], 0.3)
        gates.gate("a-1").set()
        await eventually(lambda: _has(bus, {"a-1", "all-1", "b-1"}))
    assert gates.started == ["a-1", "all-1", "b-1"]


def test_lanes_do_not_combine_with_a_batch() -> None:
    service = Service("ponger")

    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        return []

    async def settle() -> None:
        return None

    with pytest.raises(ValueError, match="lanes"):
        service.add_handler(on_ping, pings(), lanes=_lane, settle=settle)


async def _has(bus: Bus, keys: set[str]) -> bool:
    return set(await _pongs(bus)) == keys
