"""The `Bus` contract, run against the in-memory bus and a real nats-server alike."""

from __future__ import annotations

import asyncio

import pytest

from gfair.bus.topology import ConsumerSpec, DeliverPolicy, StreamSpec, Topology
from gfair.bus.transport import MSG_ID_HEADER, Bus, NoStreamForSubject, TopologyConflict

from .conftest import Broker
from .events import STREAM, TEST_STREAM

TOPOLOGY = Topology(streams=(TEST_STREAM,))


def consumer(durable: str = "c1", **options: object) -> ConsumerSpec:
    return ConsumerSpec(stream=STREAM, durable=durable, ack_wait_s=1.0, **options)  # type: ignore[arg-type]


async def test_duplicate_message_id_is_stored_once(bus: Bus) -> None:
    await bus.ensure_topology(TOPOLOGY)
    first = await bus.publish("bustest.ping.a", b"one", msg_id="evt-1")
    again = await bus.publish("bustest.ping.a", b"one", msg_id="evt-1")
    other = await bus.publish("bustest.ping.a", b"two", msg_id="evt-2")
    assert not first.duplicate
    assert again.duplicate and again.sequence == first.sequence
    assert other.sequence == first.sequence + 1
    stored = [m async for m in bus.history(STREAM)]
    assert [(m.data, m.headers.get(MSG_ID_HEADER)) for m in stored] == [
        (b"one", "evt-1"),
        (b"two", "evt-2"),
    ]


async def test_ensure_topology_is_idempotent(bus: Bus) -> None:
    topology = Topology(streams=(TEST_STREAM,), consumers=(consumer(),))
    await bus.ensure_topology(topology)
    await bus.publish("bustest.ping.a", b"x", msg_id="m1")
    await bus.ensure_topology(topology)  # again: nothing lost, nothing duplicated
    assert len([m async for m in bus.history(STREAM)]) == 1


async def test_overlapping_streams_are_refused(bus: Bus) -> None:
    await bus.ensure_topology(TOPOLOGY)
    with pytest.raises(TopologyConflict):
        await bus.ensure_topology(
            Topology(streams=(StreamSpec(name="OTHER", subjects=("bustest.ping.*",)),))
        )


async def test_publish_without_a_stream_fails(bus: Bus) -> None:
    await bus.ensure_topology(TOPOLOGY)
    with pytest.raises(NoStreamForSubject):
        await bus.publish("nowhere.at.all", b"x", msg_id="m1")


async def test_ack_settles_and_nak_redelivers_with_a_count(bus: Bus) -> None:
    await bus.ensure_topology(TOPOLOGY)
    await bus.publish("bustest.ping.a", b"1", msg_id="m1")
    await bus.publish("bustest.ping.b", b"2", msg_id="m2")
    pull = await bus.consume(consumer())
    first = await pull.fetch(10, 2.0)
    assert [(d.data, d.num_delivered) for d in first] == [(b"1", 1), (b"2", 1)]
    await first[0].ack()
    await first[1].nak()
    again = await pull.fetch(10, 2.0)
    assert [(d.data, d.num_delivered, d.stream_sequence) for d in again] == [(b"2", 2, 2)]
    await again[0].ack()
    assert await pull.fetch(10, 0.3) == []
    await pull.close()


async def test_unread_counts_what_the_consumer_has_yet_to_deliver(bus: Bus) -> None:
    spec = consumer(filter_subjects=("bustest.ping.a",))
    await bus.ensure_topology(Topology(streams=(TEST_STREAM,), consumers=(spec,)))
    for index in range(3):
        await bus.publish("bustest.ping.a", b"x", msg_id=f"a{index}")
    await bus.publish("bustest.ping.b", b"y", msg_id="b0")  # not the consumer's
    assert await bus.unread(spec) == 3
    pull = await bus.consume(spec)
    taken = await pull.fetch(2, 2.0)
    assert await bus.unread(spec) == 1  # delivered, even unacknowledged, is read
    for delivery in taken:
        await delivery.ack()
    await pull.close()


async def test_unacked_message_returns_after_ack_wait(broker: Broker) -> None:
    bus = await broker.connect()
    await bus.ensure_topology(TOPOLOGY)
    await bus.publish("bustest.ping.a", b"1", msg_id="m1")
    pull = await bus.consume(consumer())
    (delivery,) = await pull.fetch(1, 2.0)
    assert delivery.num_delivered == 1
    await pull.close()  # a worker that vanished without settling
    other = await (await broker.connect()).consume(consumer())
    (redelivered,) = await other.fetch(1, 3.0)
    assert redelivered.data == b"1" and redelivered.num_delivered == 2
    await redelivered.ack()
    await other.close()


async def test_in_progress_holds_a_slow_message(bus: Bus) -> None:
    await bus.ensure_topology(TOPOLOGY)
    await bus.publish("bustest.ping.a", b"1", msg_id="m1")
    pull = await bus.consume(consumer())
    (delivery,) = await pull.fetch(1, 2.0)
    for _ in range(3):  # 1.2 s in all, past the 1 s ack wait
        await asyncio.sleep(0.4)
        await delivery.in_progress()
    assert await pull.fetch(1, 0.3) == []
    await delivery.ack()
    await pull.close()


async def test_a_shared_durable_splits_messages_between_instances(bus: Bus) -> None:
    await bus.ensure_topology(TOPOLOGY)
    for i in range(20):
        await bus.publish(f"bustest.ping.k{i}", str(i).encode(), msg_id=f"m{i}")
    one, two = await bus.consume(consumer("shared")), await bus.consume(consumer("shared"))
    seen: list[bytes] = []
    for _ in range(20):
        for pull in (one, two):
            for delivery in await pull.fetch(3, 0.2):
                seen.append(delivery.data)
                await delivery.ack()
        if len(seen) == 20:
            break
    assert sorted(seen, key=int) == [str(i).encode() for i in range(20)]
    await one.close()
    await two.close()


async def test_filters_and_deliver_policy_new(bus: Bus) -> None:
    await bus.ensure_topology(TOPOLOGY)
    await bus.publish("bustest.ping.a", b"old", msg_id="m1")
    pongs = await bus.consume(consumer("pongs", filter_subjects=("bustest.pong.*",)))
    fresh = await bus.consume(consumer("fresh", deliver_policy=DeliverPolicy.NEW))
    await bus.publish("bustest.pong.a", b"pong", msg_id="m2")
    await bus.publish("bustest.ping.b", b"new", msg_id="m3")
    assert [d.data for d in await pongs.fetch(10, 1.0)] == [b"pong"]
    assert [d.data for d in await fresh.fetch(10, 1.0)] == [b"pong", b"new"]
    await pongs.close()
    await fresh.close()


async def test_history_is_bounded_filtered_and_ordered(bus: Bus) -> None:
    await bus.ensure_topology(TOPOLOGY)
    assert [m async for m in bus.history(STREAM)] == []
    for i in range(5):
        await bus.publish(f"bustest.{'ping' if i % 2 else 'pong'}.k", b"%d" % i, msg_id=f"m{i}")
    pings = [m async for m in bus.history(STREAM, filter_subjects=("bustest.ping.*",))]
    assert [(m.sequence, m.data) for m in pings] == [(2, b"1"), (4, b"3")]
    later = [m.sequence async for m in bus.history(STREAM, start_sequence=4)]
    assert later == [4, 5]
    seen = []
    async for message in bus.history(STREAM):
        seen.append(message.sequence)
        if message.sequence == 1:  # published while reading: not part of this read
            await bus.publish("bustest.ping.z", b"late", msg_id="late")
    assert seen == [1, 2, 3, 4, 5]


async def test_a_consumer_cannot_change_where_it_starts(bus: Bus) -> None:
    await bus.ensure_topology(Topology(streams=(TEST_STREAM,), consumers=(consumer("d"),)))
    # Editable settings may change in place ...
    await bus.ensure_topology(Topology(consumers=(consumer("d", max_ack_pending=5),)))
    # ... but moving the start of an existing durable would silently skip or replay events.
    with pytest.raises(TopologyConflict):
        await bus.ensure_topology(
            Topology(consumers=(consumer("d", deliver_policy=DeliverPolicy.NEW),))
        )
