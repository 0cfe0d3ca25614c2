"""The events of one fetch are handled in order, then settled together: the route's `settle`
hook, then every output stored, then the inputs acknowledged. `prepare` sees them first."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gfair.bus.key_value import KeyValue
from gfair.bus.memory_kv import InMemoryKeyValue
from gfair.bus.publisher import EventPublisher
from gfair.bus.service import Emit, Service
from gfair.bus.topology import BucketSpec
from gfair.bus.transport import Bus, BusError
from gfair.bus.wire import encode
from gfair.bus.write_behind import WriteBehind
from gfair.events.envelope import Envelope
from support.waiting import eventually

from .events import STREAM, Pinged, Ponged
from .test_runtime import pings, runtime, stored


async def publish_pings(bus: Bus, count: int) -> None:
    tool = EventPublisher(bus, "tool")
    for index in range(count):
        await tool.publish(Pinged(key=f"k{index}", count=index))


async def test_a_batch_is_settled_after_its_handlers_and_before_its_outputs(bus: Bus) -> None:
    log: list[str] = []
    service = Service("ponger")

    async def settle() -> None:
        pongs = await stored(bus, STREAM, "bustest.pong.")
        log.append(f"settle with {len(pongs)} pongs stored")

    @service.handler(pings(), settle=settle)
    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        log.append(f"handle {data.count}")
        return [Emit(Ponged(key=data.key, count=data.count))]

    running = runtime(service, bus)
    await running.prepare()
    await publish_pings(bus, 5)  # there before the first fetch: one batch
    async with running:
        await eventually(lambda: len(log) == 6)
        await eventually(lambda: _count_pongs(bus, 5))
    assert log == [*(f"handle {i}" for i in range(5)), "settle with 0 pongs stored"]
    pongs = await stored(bus, STREAM, "bustest.pong.")
    assert [p.data["count"] for p in pongs] == list(range(5))  # in the order handled
    pull = await bus.consume(pings())
    assert await pull.fetch(10, 0.5) == []  # every input acknowledged
    await pull.close()


async def _count_pongs(bus: Bus, count: int) -> bool:
    return len(await stored(bus, STREAM, "bustest.pong.")) == count


async def test_a_failed_settle_hands_the_whole_batch_back(bus: Bus) -> None:
    handled: list[int] = []
    failed: list[int] = []  # what the batch whose settle failed held
    failures = [RuntimeError("bucket unavailable")]
    service = Service("ponger")

    async def settle() -> None:
        if failures:
            failed.extend(handled)  # the first batch: all of it handled, none settled yet
            raise failures.pop()

    @service.handler(pings(), settle=settle)
    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        handled.append(data.count)
        return [Emit(Ponged(key=data.key, count=data.count))]

    running = runtime(service, bus)
    await running.prepare()
    await publish_pings(bus, 3)
    async with running:
        await eventually(lambda: len(handled) == 3 + len(failed) and bool(failed))
        await eventually(lambda: _count_pongs(bus, 3))
    # Every event of the failed batch is handled again (all three, unless a loaded broker
    # delivered them in more than one batch); the others once.
    assert sorted(handled) == sorted([0, 1, 2, *failed])
    # Nothing went out the first time, and the second time each output once.
    pongs = await stored(bus, STREAM, "bustest.pong.")
    assert sorted(p.data["count"] for p in pongs) == [0, 1, 2]


async def test_prepare_sees_the_valid_events_of_a_batch_before_any_handler(bus: Bus) -> None:
    seen: list[list[int]] = []
    handled: list[int] = []
    handled_before: list[list[int]] = []  # per batch: what was handled when prepare ran
    service = Service("ponger")

    async def prepare(events: Sequence[tuple[Envelope, Pinged]]) -> None:
        seen.append([data.count for _, data in events])
        handled_before.append(list(handled))

    @service.handler(pings(), prepare=prepare)
    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        handled.append(data.count)
        return []

    running = runtime(service, bus)
    await running.prepare()
    await publish_pings(bus, 2)
    # Not an envelope: the handler never sees it, nor does prepare; it is dead-lettered.
    await bus.publish("bustest.ping.junk", b"not json", msg_id="junk")
    payload, headers = encode(Envelope.wrap(Pinged(key="k9", count=9), source="tool"))
    await bus.publish("bustest.ping.k9", payload, headers=headers, msg_id="k9")
    async with running:
        await eventually(lambda: len(handled) == 3)
    # A loaded broker may deliver the stored events in more than one batch: each batch's
    # prepare ran before any of its handlers, after all of the batches before it.
    assert [count for batch in seen for count in batch] == [0, 1, 9] and handled == [0, 1, 9]
    assert handled_before == [[count for b in seen[:i] for count in b] for i in range(len(seen))]


class FlakyKeyValue(InMemoryKeyValue):
    """Fails the writes of the keys in `failing` until they are removed from it."""

    def __init__(self) -> None:
        super().__init__(BucketSpec(name="flaky"))
        self.failing: set[str] = set()

    async def put(self, key: str, value: bytes) -> int:
        if key in self.failing:
            raise BusError(f"put {key}: not acknowledged")
        return await super().put(key, value)


async def test_write_behind_sends_failed_writes_again_unless_superseded() -> None:
    kv = FlakyKeyValue()
    writes = WriteBehind()
    kv.failing = {"a", "b"}
    writes.put(kv, "a", b"a1")
    writes.put(kv, "b", b"b1")
    writes.put(kv, "c", b"c1")
    assert writes.writing(kv, "a") and writes.writing(kv, "c")
    try:
        await writes.settle()
    except BusError:
        pass
    else:
        raise AssertionError("a failed write must fail the settling")
    assert await _value(kv, "c") == b"c1" and await _value(kv, "a") is None
    assert writes.writing(kv, "a") and not writes.writing(kv, "c")

    kv.failing = set()
    writes.put(kv, "b", b"b2")  # supersedes the failed b1
    await writes.settle()
    assert await _value(kv, "a") == b"a1"  # sent again
    assert await _value(kv, "b") == b"b2"
    assert not writes.writing(kv, "a")
    await writes.settle()  # nothing left to send


async def test_write_behind_keeps_the_order_of_one_key() -> None:
    kv = InMemoryKeyValue(BucketSpec(name="ordered"))
    writes = WriteBehind()
    for version in range(20):
        writes.put(kv, "k", f"v{version}".encode())
    writes.delete(kv, "gone")
    await asyncio.gather(writes.settle())
    assert await _value(kv, "k") == b"v19"


async def _value(kv: KeyValue, key: str) -> bytes | None:
    entry = await kv.get(key)
    return entry.value if entry is not None else None
