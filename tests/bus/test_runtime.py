"""The handler runtime: one suite, run on the in-memory bus and on a real nats-server."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import pytest

from gfair.bus.dead_letter import PAYLOAD_KEPT, DeadLetter, DeadLetterReason
from gfair.bus.key_value import KeyValue, KvConflict
from gfair.bus.publisher import EventPublisher, derived_event_id
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.service import Backoff, Emit, Service, Unprocessable
from gfair.bus.topology import (
    DEAD_LETTER_STREAM,
    BucketSpec,
    ConsumerSpec,
    Topology,
    contract_streams,
)
from gfair.bus.transport import Bus, Delivery, PullConsumer
from gfair.bus.wire import encode, server_timed
from gfair.events import JobCancelRequested, JobSubmitted
from gfair.events.envelope import Envelope
from support.waiting import consistently, eventually

from .conftest import FAST, Broker
from .events import STREAM, TEST_STREAM, Noted, Pinged, Ponged

TOPOLOGY = Topology(streams=(TEST_STREAM,), buckets=(BucketSpec(name="effects"),))
QUICK_RETRY = Backoff(initial_s=0.01, factor=2.0, max_s=0.05)


def pings(durable: str = "pinger", **options: object) -> ConsumerSpec:
    settings: dict[str, object] = {"ack_wait_s": 1.0, "max_attempts": 3} | options
    return ConsumerSpec(
        stream=STREAM,
        durable=durable,
        filter_subjects=("bustest.ping.*",),
        **settings,  # type: ignore[arg-type]
    )


def runtime(service: Service, bus: Bus, **kwargs: object) -> ServiceRuntime:
    return ServiceRuntime(service, bus, settings=FAST, extra_topology=TOPOLOGY, **kwargs)  # type: ignore[arg-type]


async def stored(bus: Bus, stream: str, prefix: str = "") -> list[Envelope]:
    return [
        Envelope.model_validate_json(m.data)
        async for m in bus.history(stream)
        if m.subject.startswith(prefix)
    ]


async def dead_letters(bus: Bus) -> list[DeadLetter]:
    return [DeadLetter.model_validate_json(m.data) async for m in bus.history(DEAD_LETTER_STREAM)]


async def record_effect(kv: KeyValue, envelope: Envelope) -> bool:
    """The idempotent side effect of the tests: True the first time for an event id."""
    try:
        await kv.create(f"effect.{envelope.id}", envelope.type.encode())
    except KvConflict:
        return False
    return True


async def test_outputs_are_published_with_causation_and_correlation(bus: Bus) -> None:
    service = Service("ponger")
    seen: list[Pinged] = []

    @service.handler(pings())
    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        seen.append(data)
        return [Emit(Ponged(key=data.key, count=data.count + 1))]

    tool = EventPublisher(bus, "tool")
    async with runtime(service, bus):
        first = await tool.publish(Pinged(key="a", count=1), correlation_id="job-a")
        second = await tool.publish(Pinged(key="b", count=5))
        await eventually(lambda: len(seen) == 2)
        pongs = await stored_eventually(bus, "bustest.pong.", 2)
    assert seen == [Pinged(key="a", count=1), Pinged(key="b", count=5)]
    by_cause = {p.causation_id: p for p in pongs}
    pong_a, pong_b = by_cause[first.id], by_cause[second.id]
    assert (pong_a.subject, pong_a.data["count"], pong_a.source) == ("bustest.pong.a", 2, "ponger")
    assert pong_a.correlation_id == "job-a"
    assert pong_b.correlation_id == second.id  # no correlation yet: the cause starts one
    assert pong_a.id == derived_event_id(first.id, 0, Ponged.EVENT_TYPE, "bustest.pong.a")


async def stored_eventually(bus: Bus, prefix: str, count: int) -> list[Envelope]:
    found: list[Envelope] = []

    async def enough() -> bool:
        found[:] = await stored(bus, STREAM, prefix)
        return len(found) >= count

    await eventually(enough)
    return found


async def publish_raw(bus: Bus, subject: str, payload: bytes, msg_id: str) -> None:
    await bus.publish(subject, payload, msg_id=msg_id)


async def test_poison_messages_are_dead_lettered_and_the_next_is_handled(bus: Bus) -> None:
    service = Service("ponger")
    handled: list[str] = []

    @service.handler(pings())
    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        handled.append(data.key)
        return []

    async with runtime(service, bus):
        await publish_raw(bus, "bustest.ping.x", b"\xff\xfe not json", "raw-1")
        bad_count = Envelope.wrap(Pinged(key="y"), source="tool").model_copy(
            update={"data": {"key": "y", "count": -1}}
        )
        await publish_raw(bus, "bustest.ping.y", encode(bad_count)[0], "bad-count")
        unknown = Envelope.wrap(Pinged(key="z"), source="tool").model_copy(
            update={"type": "gfair.test.unknown.v1"}
        )
        await publish_raw(bus, "bustest.ping.z", encode(unknown)[0], "unknown")
        # A payload for "mallory" on alice's subject: the tenant check refuses it.
        spoofed = Envelope.wrap(Pinged(key="mallory"), source="tool", subject="bustest.ping.alice")
        await publish_raw(bus, "bustest.ping.alice", encode(spoofed)[0], "spoofed")
        await EventPublisher(bus, "tool").publish(Pinged(key="good"))
        await eventually(lambda: handled == ["good"])
        letters: list[DeadLetter] = []

        async def four_letters() -> bool:
            letters[:] = await dead_letters(bus)
            return len(letters) == 4

        await eventually(four_letters)
    by_subject = {letter.subject: letter for letter in letters}
    raw = by_subject["bustest.ping.x"]
    assert raw.reason is DeadLetterReason.UNDECODABLE
    assert raw.payload_encoding == "base64" and raw.original_payload() == b"\xff\xfe not json"
    assert raw.stream == STREAM and raw.consumer == "pinger" and raw.service == "ponger"
    invalid = by_subject["bustest.ping.y"]
    assert invalid.reason is DeadLetterReason.INVALID and "data.count" in invalid.error
    assert invalid.headers.get("Nats-Msg-Id") == "bad-count"
    assert by_subject["bustest.ping.z"].reason is DeadLetterReason.INVALID
    assert "gfair.test.unknown.v1" in by_subject["bustest.ping.z"].error
    assert by_subject["bustest.ping.alice"].reason is DeadLetterReason.INVALID
    assert "subject" in by_subject["bustest.ping.alice"].error
    assert {m.subject async for m in bus.history(DEAD_LETTER_STREAM)} == {"gfair.dlq.BUSTEST"}


async def test_a_poison_message_near_the_brokers_limit_is_dead_lettered_and_no_more(
    bus: Bus,
) -> None:
    """Issue 41's second red-team pass: a tenant's undecodable ~1 MB submission made its dead
    letter (the copy and its headers) go over the broker's 1 MiB limit; the broker dropped the
    services' connections, and they crash-looped until its fifth delivery."""
    service = Service("ponger")
    handled: list[str] = []

    @service.handler(pings())
    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        handled.append(data.key)
        return []

    huge = b"{" + b" " * 1_048_400 + b"}"
    async with runtime(service, bus):
        await publish_raw(bus, "bustest.ping.x", huge, "huge")
        await EventPublisher(bus, "tool").publish(Pinged(key="after"))
        await eventually(lambda: handled == ["after"])
        letters: list[DeadLetter] = []

        async def one_letter() -> bool:
            letters[:] = await dead_letters(bus)
            return len(letters) == 1

        await eventually(one_letter)
    [letter] = letters
    assert letter.reason is DeadLetterReason.UNDECODABLE and letter.num_delivered == 1
    assert letter.payload_bytes == len(huge)
    assert letter.original_payload() == huge[:PAYLOAD_KEPT]


async def test_a_handler_failing_past_the_limit_is_dead_lettered(bus: Bus) -> None:
    service = Service("ponger")
    attempts: Counter[str] = Counter()

    @service.handler(pings(max_attempts=3), backoff=QUICK_RETRY)
    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        attempts[data.key] += 1
        if data.key == "bad":
            raise RuntimeError("model weights missing")
        if data.key == "flaky" and attempts["flaky"] < 3:
            raise ConnectionError("transient")
        return [Emit(Ponged(key=data.key))]

    tool = EventPublisher(bus, "tool")
    async with runtime(service, bus):
        await tool.publish(Pinged(key="bad"))
        await tool.publish(Pinged(key="flaky"))
        await tool.publish(Pinged(key="good"))
        letters: list[DeadLetter] = []

        async def dead_lettered() -> bool:
            letters[:] = await dead_letters(bus)
            return len(letters) == 1

        await eventually(dead_lettered)
        await stored_eventually(bus, "bustest.pong.", 2)
    (letter,) = letters
    assert letter.reason is DeadLetterReason.HANDLER_FAILED
    assert letter.num_delivered == 3 and "RuntimeError: model weights missing" in letter.error
    assert attempts == {"bad": 3, "flaky": 3, "good": 1}
    pongs = await stored(bus, STREAM, "bustest.pong.")
    assert sorted(p.data["key"] for p in pongs) == ["flaky", "good"]


async def test_unprocessable_is_dead_lettered_without_retrying(bus: Bus) -> None:
    service = Service("ponger")
    calls = 0

    @service.handler(pings())
    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        nonlocal calls
        calls += 1
        raise Unprocessable(f"job {data.key} asks for 9999 GPUs")

    async with runtime(service, bus):
        await EventPublisher(bus, "tool").publish(Pinged(key="huge"))
        letters: list[DeadLetter] = []

        async def one() -> bool:
            letters[:] = await dead_letters(bus)
            return len(letters) == 1

        await eventually(one)
    assert calls == 1
    assert letters[0].reason is DeadLetterReason.REJECTED and "9999 GPUs" in letters[0].error


async def test_events_of_other_types_on_the_consumer_are_skipped(bus: Bus) -> None:
    service = Service("ponger")
    seen: list[str] = []
    everything = ConsumerSpec(stream=STREAM, durable="all", ack_wait_s=1.0)

    @service.handler(everything)
    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        seen.append(envelope.type)
        return []

    tool = EventPublisher(bus, "tool")
    async with runtime(service, bus):
        await tool.publish(Noted(key="n"))
        await tool.publish(Pinged(key="p"))
        await eventually(lambda: seen == [Pinged.EVENT_TYPE])
    assert await dead_letters(bus) == []


class _LostAckDelivery:
    """A delivery whose ack never reaches the server: the process died right before it."""

    def __init__(self, inner: Delivery) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    @property
    def headers(self) -> Mapping[str, str]:
        return self._inner.headers

    async def ack(self) -> None:
        return None


class _LostAckConsumer:
    def __init__(self, inner: PullConsumer) -> None:
        self._inner = inner
        self.spec = inner.spec

    async def fetch(self, batch: int, timeout_s: float) -> list[Delivery]:
        return [_LostAckDelivery(d) for d in await self._inner.fetch(batch, timeout_s)]  # type: ignore[misc]

    async def close(self) -> None:
        await self._inner.close()


class _LostAckBus:
    def __init__(self, inner: Bus) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def consume(self, spec: ConsumerSpec) -> PullConsumer:
        return _LostAckConsumer(await self._inner.consume(spec))


async def test_a_crash_before_ack_redelivers_and_the_effect_happens_once(broker: Broker) -> None:
    def make_service(log: list[tuple[str, int, bool]]) -> Service:
        service = Service("ponger")

        @service.handler(pings())
        async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
            kv = await crashed_bus.key_value("effects")
            log.append((data.key, data.count, await record_effect(kv, envelope)))
            return [Emit(Ponged(key=data.key, count=data.count))]

        return service

    crashed_bus = await broker.connect()
    first_log: list[tuple[str, int, bool]] = []
    first = runtime(make_service(first_log), _LostAckBus(crashed_bus))  # type: ignore[arg-type]
    await first.start()
    ping = await EventPublisher(crashed_bus, "tool").publish(Pinged(key="a", count=7))
    await eventually(lambda: len(first_log) == 1)
    await stored_eventually(crashed_bus, "bustest.pong.", 1)
    await first.abort()
    await broker.crash(crashed_bus)

    crashed_bus = await broker.connect()  # the restarted process
    second_log: list[tuple[str, int, bool]] = []
    async with runtime(make_service(second_log), crashed_bus):
        await eventually(lambda: len(second_log) == 1)  # redelivered after the ack wait
    assert first_log == [("a", 7, True)]
    assert second_log == [("a", 7, False)]  # handled again, but the effect is not repeated
    kv = await crashed_bus.key_value("effects")
    assert await kv.keys() == [f"effect.{ping.id}"]
    pongs = await stored(crashed_bus, STREAM, "bustest.pong.")
    assert len(pongs) == 1 and pongs[0].causation_id == ping.id  # republished output deduped


async def test_a_handler_killed_mid_way_gets_the_event_again(broker: Broker) -> None:
    bus = await broker.connect()
    hang = asyncio.Event()
    calls: list[int] = []
    service = Service("ponger")

    @service.handler(pings())
    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        calls.append(data.count)
        if len(calls) == 1:
            await hang.wait()  # never set: the process dies here
        return []

    first = runtime(service, bus)
    await first.start()
    await EventPublisher(bus, "tool").publish(Pinged(key="a", count=1))
    await eventually(lambda: len(calls) == 1)
    await first.abort()
    await broker.crash(bus)
    bus = await broker.connect()
    async with runtime(service, bus):
        await eventually(lambda: len(calls) == 2)
    assert calls == [1, 1]


async def test_a_restarted_service_resumes_from_its_durable_consumer(broker: Broker) -> None:
    handled: Counter[str] = Counter()

    def make_service(bus: Bus) -> Service:
        service = Service("counter")

        @service.handler(pings())
        async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
            assert await record_effect(await bus.key_value("effects"), envelope)
            handled[data.key] += 1
            await asyncio.sleep(0.005)  # pause under test: handling takes a while
            return []

        return service

    bus = await broker.connect()
    tool = EventPublisher(bus, "tool")
    first = runtime(make_service(bus), bus)
    await first.start()
    for i in range(30):
        await tool.publish(Pinged(key=f"k{i}"))
    await eventually(lambda: sum(handled.values()) >= 10)
    await first.stop()  # mid-stream: some handled, some fetched and handed back, some never seen
    stopped_at = sum(handled.values())
    assert stopped_at < 30
    for i in range(30, 50):
        await tool.publish(Pinged(key=f"k{i}"))

    bus2 = await broker.connect()
    async with runtime(make_service(bus2), bus2):
        await eventually(lambda: sum(handled.values()) == 50)
        await consistently(lambda: sum(handled.values()) == 50, 0.2)  # nothing more arrives
    assert handled == Counter({f"k{i}": 1 for i in range(50)})
    assert len(await (await bus2.key_value("effects")).keys()) == 50


async def test_instances_sharing_a_durable_split_the_work(broker: Broker) -> None:
    handled_by: dict[str, list[int]] = {"one": [], "two": []}

    def instance(name: str) -> Service:
        service = Service("worker")

        @service.handler(pings("workers"))
        async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
            handled_by[name].append(data.count)
            await asyncio.sleep(0.002)  # pause under test: work, so both instances get a share
            return []

        return service

    one, two = await broker.connect(), await broker.connect()
    async with runtime(instance("one"), one), runtime(instance("two"), two):
        tool = EventPublisher(one, "tool")
        for i in range(60):
            await tool.publish(Pinged(key="k", count=i))
        await eventually(lambda: len(handled_by["one"]) + len(handled_by["two"]) == 60)
    assert sorted(handled_by["one"] + handled_by["two"]) == list(range(60))
    assert handled_by["one"] and handled_by["two"]


async def test_stop_lets_the_handler_in_flight_finish(bus: Bus) -> None:
    service = Service("ponger")
    started = asyncio.Event()

    @service.handler(pings())
    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        started.set()
        await asyncio.sleep(0.3)  # pause under test: a handler still in flight at the stop
        return [Emit(Ponged(key=data.key))]

    running = runtime(service, bus)
    await running.start()
    await EventPublisher(bus, "tool").publish(Pinged(key="slow"))
    await asyncio.wait_for(started.wait(), 5)
    await running.stop()
    assert [p.data["key"] for p in await stored(bus, STREAM, "bustest.pong.")] == ["slow"]
    # ... and it was acknowledged: a fresh instance on the same durable finds nothing.
    pull = await bus.consume(pings())
    assert await pull.fetch(1, 1.5) == []
    await pull.close()


async def test_sigterm_stops_gracefully(bus: Bus) -> None:
    service = Service("ponger")
    started, finished = asyncio.Event(), asyncio.Event()

    @service.handler(pings())
    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        started.set()
        await asyncio.sleep(0.2)  # pause under test: a handler in flight at the signal
        finished.set()
        return []

    running = runtime(service, bus)
    await running.prepare()
    task = asyncio.create_task(running.run(handle_signals=True))
    await EventPublisher(bus, "tool").publish(Pinged(key="a"))
    await asyncio.wait_for(started.wait(), 5)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(task, 5)
    assert finished.is_set() and running.stopping


async def test_timers_publish_and_startup_hooks_run_first(bus: Bus) -> None:
    service = Service("ticker")
    order: list[str] = []
    ticks = 0

    @service.on_start
    async def load(rt: ServiceRuntime) -> None:
        order.append("startup")
        kv = await rt.key_value("effects")  # the topology exists by now
        await kv.put("loaded", b"yes")

    @service.timer(0.05)
    async def tick() -> list[Emit]:
        nonlocal ticks
        ticks += 1
        order.append("tick")
        return [Emit(Noted(key=f"t{ticks}"))]

    async with runtime(service, bus):
        notes = await stored_eventually(bus, "bustest.note.", 3)
    assert order[0] == "startup" and order.count("startup") == 1
    assert len({n.id for n in notes}) == len(notes)
    assert [n.data["key"] for n in notes[:3]] == ["t1", "t2", "t3"]


def test_handlers_take_their_payload_model_from_the_annotation() -> None:
    service = Service("ponger")

    @service.handler(pings())
    async def on_ping(envelope: Envelope, data: Pinged | Noted) -> list[Emit]:
        return []

    (route,) = service.routes
    assert route.accepted_types == {Pinged.EVENT_TYPE, Noted.EVENT_TYPE}
    with pytest.raises(TypeError, match="EventData"):

        @service.handler(pings("other"))
        async def wrong(envelope: Envelope, data: int) -> list[Emit]:
            return []


def test_a_handler_without_a_consumer_gets_one_from_its_payload_model() -> None:
    service = Service("placement")

    @service.handler()
    async def on_submit(envelope: Envelope, data: JobSubmitted | JobCancelRequested) -> list[Emit]:
        return []

    (route,) = service.routes
    assert route.consumer.stream == "GFAIR_JOBS"
    assert route.consumer.durable == "placement-on-submit"
    assert route.consumer.filter_subjects == ("gfair.cancel.*", "gfair.submit.*")
    assert service.topology.consumers == (route.consumer,)
    with pytest.raises(ValueError, match="already has a handler"):
        service.add_handler(on_submit)


async def test_a_tenants_envelope_time_is_replaced_by_when_the_stream_stored_it(bus: Bus) -> None:
    """A tenant writes its envelope's time itself: handlers see the stream's instead
    (issue 11, item 5). Events on service subjects keep the time their publisher gave."""
    service = Service("timekeeper")
    seen: list[Envelope] = []

    @service.handler()
    async def on_submit(envelope: Envelope, data: JobSubmitted | JobCancelRequested) -> list[Emit]:
        seen.append(envelope)
        return []

    forged = datetime(2001, 1, 1, tzinfo=UTC)
    before = datetime.now(UTC)
    publisher = EventPublisher(bus, source="tenant")
    jobs = Topology(streams=tuple(s for s in contract_streams() if s.name == "GFAIR_JOBS"))
    running = ServiceRuntime(service, bus, settings=FAST, extra_topology=jobs)
    await running.prepare()
    for data in (
        JobSubmitted(user="alice", job_id="late", gpus=1, command=("true",)),
        JobCancelRequested(user="alice", job_id="late"),
    ):
        await publisher.publish_envelope(Envelope.wrap(data, source="tenant", time=forged))
    task = asyncio.create_task(running.run(handle_signals=False))
    try:
        await eventually(lambda: len(seen) == 2)
    finally:
        await running.stop()
        await task
    after = datetime.now(UTC)
    # Stored by the server between the two readings of this clock (same machine), never 2001.
    for envelope in seen:
        assert before - timedelta(seconds=1) <= envelope.time <= after + timedelta(seconds=1)
    # The rule is the subject's, not the type's: a service subject keeps its publisher's time.
    kept = server_timed(seen[0].model_copy(update={"time": forged}), "gfair.job.a.b.x", after)
    assert kept.time == forged
