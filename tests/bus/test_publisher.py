"""Publishing with `persist`: an event the broker does not acknowledge goes out again, under the
same id, while its publisher's process runs."""

from __future__ import annotations

from typing import Any

import pytest

from gfair.bus import publisher
from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.publisher import EventPublisher
from gfair.bus.topology import Topology
from gfair.bus.transport import MSG_ID_HEADER, PubAck, PublishFailed

from .events import STREAM, TEST_STREAM, Pinged


class _BusyBroker(InMemoryBus):
    """Refuses the first `refusals` publishes, recording the id of each attempt."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals
        self.attempts: list[str | None] = []

    async def publish(self, subject: str, payload: bytes, **options: Any) -> PubAck:
        self.attempts.append(options.get("msg_id"))
        if self.refusals > 0:
            self.refusals -= 1
            raise PublishFailed(f"publish to {subject!r} not acknowledged")
        return await super().publish(subject, payload, **options)


@pytest.fixture(autouse=True)
def _quick_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher, "AGAIN_AFTER_S", 0.001)


async def test_a_persisted_event_is_published_again_under_its_id_until_stored() -> None:
    bus = _BusyBroker(refusals=3)
    await bus.ensure_topology(Topology(streams=(TEST_STREAM,)))
    sent = await EventPublisher(bus, "svc", running=lambda: True).publish(
        Pinged(key="a"), persist=True
    )
    assert bus.attempts == [sent.id] * 4
    stored = [m async for m in bus.history(STREAM)]
    assert [m.headers.get(MSG_ID_HEADER) for m in stored] == [sent.id]


async def test_without_persist_or_once_stopping_a_refused_publish_fails() -> None:
    bus = _BusyBroker(refusals=10)
    await bus.ensure_topology(Topology(streams=(TEST_STREAM,)))
    with pytest.raises(PublishFailed):
        await EventPublisher(bus, "svc", running=lambda: True).publish(Pinged(key="a"))
    assert len(bus.attempts) == 1
    running = iter([True, True, False])  # the process stops after two repeats
    with pytest.raises(PublishFailed):
        await EventPublisher(bus, "svc", running=lambda: next(running)).publish(
            Pinged(key="b"), persist=True
        )
    assert len(bus.attempts) == 1 + 3
    # A tool's publisher (no process to outlive) never repeats.
    with pytest.raises(PublishFailed):
        await EventPublisher(bus, "tool").publish(Pinged(key="c"), persist=True)
    assert len(bus.attempts) == 1 + 3 + 1
