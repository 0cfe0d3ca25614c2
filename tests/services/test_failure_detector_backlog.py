"""A failure detector that falls behind its heartbeats (issue 26), on a real nats-server too.

The detector's node consumer is held back while the nodes go on heartbeating, as a detector
too busy to read them would be: the heartbeats queue on the broker. Judged by when it read
them, every node would look silent; the detector must see its own backlog instead, and still
fail a node that really stopped, once it has read what the others sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta

import pytest

from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.publisher import EventPublisher
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.server import EmbeddedNatsServer
from gfair.bus.service import Emit
from gfair.bus.topology import ConsumerSpec
from gfair.bus.transport import Bus, BusError
from gfair.events.envelope import Envelope
from gfair.events.nodes import NodeFailed, NodeSuspected
from gfair_services.failure_detector.service import NodeInput
from support.clock import FakeClock
from support.waiting import eventually

from .test_failure_detector import (
    FAST,
    T0,
    ObservedDetector,
    heartbeat,
    registered,
    settings,
)

NODES = [f"n{i:02d}" for i in range(20)]


class HeldDetector(ObservedDetector):
    """Reads no node event while `reading` is clear: they wait on the broker, unread."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.reading = asyncio.Event()
        self.reading.set()
        super().__init__(*args, **kwargs)

    async def on_node_event(self, envelope: Envelope, data: NodeInput) -> Sequence[Emit]:
        await self.reading.wait()
        return await super().on_node_event(envelope, data)


@pytest.fixture(params=["memory", pytest.param("nats", marks=pytest.mark.nats)])
async def bus(request: pytest.FixtureRequest) -> AsyncIterator[Bus]:
    found: Bus
    if request.param == "memory":
        found = InMemoryBus()
    else:
        server: EmbeddedNatsServer = request.getfixturevalue("nats_server")
        found = await NatsBus.connect(NatsOptions(servers=(server.url,)))
    try:
        yield found
    finally:
        await found.close()


async def judged(bus: Bus) -> list[tuple[str, str]]:
    """(event type, node) of every suspicion and failure the detector published."""
    found = []
    wanted = {NodeSuspected.EVENT_TYPE: "suspected", NodeFailed.EVENT_TYPE: "failed"}
    async for message in bus.history("GFAIR_NODES"):
        envelope = Envelope.model_validate_json(message.data)
        if envelope.source == "failure-detector" and envelope.type in wanted:
            found.append((wanted[envelope.type], str(envelope.data["node_id"])))
    return found


async def lagging_detector(
    bus: Bus, clock: FakeClock, detector: HeldDetector, *, silent: str | None
) -> None:
    """Every node registered and heard at 0 s; then three rounds of heartbeats (none from
    `silent`) left unread, and a check at 70 s, past the failure timeout of the first."""
    tool = EventPublisher(bus, "node")
    sent = [await tool.publish(registered(node)) for node in NODES]
    sent += [await tool.publish(heartbeat(node, 1)) for node in NODES]
    await eventually(lambda: all(e.id in detector.handled for e in sent), timeout_s=20.0)
    detector.reading.clear()
    for seq in (2, 3, 4):
        for node in NODES:
            if node != silent:
                await tool.publish(heartbeat(node, seq))
    clock.at(70)
    await detector.check()


async def test_a_detector_behind_its_heartbeats_suspects_nobody(bus: Bus) -> None:
    clock = FakeClock(T0)
    detector = HeldDetector(settings(), clock=clock)
    async with ServiceRuntime(detector.service, bus, settings=FAST):
        await lagging_detector(bus, clock, detector, silent=None)
        assert detector.behind
        assert await judged(bus) == []
        detector.reading.set()  # it catches up: every heartbeat read at 70 s
        await eventually(lambda: len(detector.handled) == 5 * len(NODES), timeout_s=20.0)
        clock.at(80)
        await detector.check()
        assert not detector.behind
        assert await judged(bus) == []


async def test_a_node_silent_through_the_backlog_is_failed_once_it_is_read(bus: Bus) -> None:
    clock = FakeClock(T0)
    detector = HeldDetector(settings(), clock=clock)
    async with ServiceRuntime(detector.service, bus, settings=FAST):
        await lagging_detector(bus, clock, detector, silent="n07")
        assert await judged(bus) == []
        detector.reading.set()
        await eventually(lambda: len(detector.handled) == 5 * len(NODES) - 3, timeout_s=20.0)
        clock.at(71)
        await detector.check()
        # Last read at 0 s: silent 71 s, past the 60 s to fail; the others read at 70 s.
        assert await judged(bus) == [("failed", "n07")]


class Unanswering(InMemoryBus):
    """A broker too loaded to say how many messages wait on a consumer."""

    async def unread(self, spec: ConsumerSpec) -> int:
        raise BusError("timed out asking for the consumer's info")


async def heard_at(tool: EventPublisher, node: str, seq: int, sent_s: float) -> Envelope:
    """A heartbeat of `node` sent `sent_s` seconds into the test's clock."""
    envelope = Envelope.wrap(
        heartbeat(node, seq), source="node", time=T0 + timedelta(seconds=sent_s)
    )
    await tool.publish_envelope(envelope)
    return envelope


async def test_a_detector_whose_broker_cannot_count_its_backlog_judges_by_what_it_reads() -> None:
    # The broker does not answer how many heartbeats wait: the heartbeats read tell how late
    # the detector reads them. Held back after the first round, it has read nothing sent
    # after 0 s by 70 s: it suspects nobody (before, it judged them as heard, and failed all).
    bus = Unanswering()
    clock = FakeClock(T0)
    detector = HeldDetector(settings(), clock=clock)
    async with ServiceRuntime(detector.service, bus, settings=FAST):
        tool = EventPublisher(bus, "node")
        sent = [await tool.publish(registered(node)) for node in NODES]
        sent += [await heard_at(tool, node, 1, 0.0) for node in NODES]
        await eventually(lambda: all(e.id in detector.handled for e in sent), timeout_s=20.0)
        detector.reading.clear()
        for seq, at_s in ((2, 20.0), (3, 40.0), (4, 65.0)):
            for node in NODES:
                if node != "n07":
                    await heard_at(tool, node, seq, at_s)
        clock.at(70)
        await detector.check()
        assert detector.behind
        assert await judged(bus) == []
        # Caught up (read at 70 s, the freshest sent at 65 s), it judges again: the node that
        # stopped, last read at 0 s, is failed (the others were read at 70 s).
        detector.reading.set()
        await eventually(lambda: len(detector.handled) == 5 * len(NODES) - 3, timeout_s=20.0)
        await detector.check()
        assert not detector.behind
        assert await judged(bus) == [("failed", "n07")]
