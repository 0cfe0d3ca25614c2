"""What only a real server can show: durability across restarts and surviving reconnects."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import nats.js.errors
import pytest

from gfair.bus import nats_bus, nats_consumer
from gfair.bus.key_value import KvConflict
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.publisher import EventPublisher
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.server import EmbeddedNatsServer, NatsServerConfig, NatsServerError
from gfair.bus.service import Emit, Service
from gfair.bus.topology import BucketSpec, ConsumerSpec, StreamSpec, Topology
from gfair.events.envelope import Envelope
from support.waiting import eventually

from .conftest import FAST
from .events import STREAM, TEST_STREAM, Pinged

pytestmark = pytest.mark.nats

TOPOLOGY = Topology(streams=(TEST_STREAM,), buckets=(BucketSpec(name="effects"),))


async def connect(server: EmbeddedNatsServer) -> NatsBus:
    return await NatsBus.connect(
        NatsOptions(servers=(server.url,), reconnect_wait_s=0.05, publish_attempt_timeout_s=0.5)
    )


async def test_streams_consumers_and_buckets_survive_a_server_restart(
    nats_server: EmbeddedNatsServer,
) -> None:
    bus = await connect(nats_server)
    spec = ConsumerSpec(stream=STREAM, durable="d", ack_wait_s=1.0)
    await bus.ensure_topology(TOPOLOGY)
    for i in range(3):
        await bus.publish(f"bustest.ping.k{i}", b"%d" % i, msg_id=f"m{i}")
    await (await bus.key_value("effects")).put("k", b"v")
    pull = await bus.consume(spec)
    (first,) = await pull.fetch(1, 2.0)
    await first.ack()
    await bus.close()

    nats_server.restart()
    bus = await connect(nats_server)
    assert [m.data async for m in bus.history(STREAM)] == [b"0", b"1", b"2"]
    entry = await (await bus.key_value("effects")).get("k")
    assert entry is not None and entry.value == b"v"
    pull = await bus.consume(spec)
    rest = await pull.fetch(10, 2.0)
    assert [d.data for d in rest] == [b"1", b"2"]  # the acked one stays acked
    await bus.close()


@pytest.mark.slow
async def test_a_server_restart_mid_stream_loses_and_doubles_nothing(
    nats_server: EmbeddedNatsServer,
) -> None:
    bus = await connect(nats_server)
    await bus.ensure_topology(TOPOLOGY)
    effects = await bus.key_value("effects")
    handled: Counter[str] = Counter()
    service = Service("counter")

    @service.handler(ConsumerSpec(stream=STREAM, durable="counter", ack_wait_s=2.0))
    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        # A write whose reply was lost in the restart fails here and succeeds on the retry
        # with a conflict: either way the effect is recorded exactly once.
        with contextlib.suppress(KvConflict):
            await effects.create(f"e.{envelope.id}", b"1")
        handled[data.key] += 1
        return []

    runtime = ServiceRuntime(service, bus, settings=FAST, extra_topology=TOPOLOGY)
    async with runtime:
        tool = EventPublisher(bus, "tool")

        async def produce() -> None:
            for i in range(60):
                await tool.publish(Pinged(key=f"k{i}"))
                await asyncio.sleep(0.005)

        producer = asyncio.create_task(produce())
        await eventually(lambda: len(handled) >= 15)
        await asyncio.to_thread(nats_server.restart)
        await asyncio.wait_for(producer, 30)
        await eventually(lambda: len(handled) == 60, timeout_s=30)
    stored = [Envelope.model_validate_json(m.data).data["key"] async for m in bus.history(STREAM)]
    assert sorted(stored) == sorted(f"k{i}" for i in range(60))  # once each: retries deduped
    assert len(await effects.keys()) == 60
    assert set(handled) == {f"k{i}" for i in range(60)}
    await bus.close()


def test_a_missing_binary_is_reported_clearly(tmp_path: Path) -> None:
    server = EmbeddedNatsServer(
        NatsServerConfig(store_dir=tmp_path), binary=tmp_path / "no-such-nats-server"
    )
    with pytest.raises(NatsServerError, match="cannot run nats-server"):
        server.start()
    assert not server.running


def test_a_server_that_cannot_start_is_reported_with_its_log(tmp_path: Path) -> None:
    bad_config = tmp_path / "bad.conf"
    bad_config.write_text("this is { not valid")
    server = EmbeddedNatsServer(NatsServerConfig(store_dir=tmp_path, config_file=bad_config))
    with pytest.raises(NatsServerError, match="exited"):
        server.start(timeout_s=5)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.mark.slow
async def test_embedded_servers_form_a_three_node_jetstream_cluster(tmp_path: Path) -> None:
    cluster_ports = [_free_port() for _ in range(3)]
    routes = tuple(f"nats://127.0.0.1:{port}" for port in cluster_ports)
    servers = [
        EmbeddedNatsServer(
            NatsServerConfig(
                store_dir=tmp_path / f"n{i}",
                server_name=f"n{i}",
                cluster_name="gfair",
                cluster_listen=routes[i],
                routes=routes,
            )
        )
        for i in range(3)
    ]
    try:
        for server in servers:
            server.start()
        buses = [await NatsBus.connect(NatsOptions(servers=(s.url,))) for s in servers]
        replicated = StreamSpec(name=STREAM, subjects=TEST_STREAM.subjects, replicas=3)
        # Waits for the cluster to elect a meta leader before declaring anything.
        await buses[0].ensure_topology(Topology(streams=(replicated,)))
        await buses[1].publish("bustest.ping.a", b"via n1", msg_id="m1")
        await buses[2].publish("bustest.ping.a", b"via n1", msg_id="m1")  # deduped cluster-wide
        await buses[2].publish("bustest.ping.b", b"via n2", msg_id="m2")
        assert [m.data async for m in buses[0].history(STREAM)] == [b"via n1", b"via n2"]
        for bus in buses:
            await bus.close()
    finally:
        for server in servers:
            server.stop()


async def test_a_publish_still_in_process_is_retried_and_stored_once(
    nats_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After a leader change a retried publish can reach the stream while the first attempt is
    # still being stored: JetStream answers "duplicate message id is in process" (10158).
    bus = await connect(nats_server)
    await bus.ensure_topology(TOPOLOGY)
    js = bus._js  # the JetStream context whose answer is replaced
    store = js.publish
    answers: list[str] = []

    async def first_in_process(*args: Any, **kwargs: Any) -> Any:
        ack = await store(*args, **kwargs)
        if not answers:
            answers.append("in process")
            raise nats.js.errors.APIError(
                code=409, err_code=10158, description="duplicate message id is in process"
            )
        answers.append("stored")
        return ack

    monkeypatch.setattr(js, "publish", first_in_process)
    ack = await bus.publish("bustest.ping.a", b"once", msg_id="once")
    assert answers == ["in process", "stored"]
    assert ack.duplicate
    assert [m.data async for m in bus.history(STREAM)] == [b"once"]
    await bus.close()


async def test_a_consumer_deleted_between_fetches_is_declared_again(
    nats_server: EmbeddedNatsServer,
) -> None:
    # No request is open when it goes, so no "deleted" status tells the fetcher: only the
    # server's silence (or its "no responders") does.
    bus = await connect(nats_server)
    await bus.ensure_topology(TOPOLOGY)
    consumer = await bus.consume(ConsumerSpec(stream=STREAM, durable="quiet", ack_wait_s=2.0))
    await bus.client.jetstream().delete_consumer(STREAM, "quiet")
    await bus.publish("bustest.ping.a", b"after", msg_id="after")
    received: list[bytes] = []
    deadline = time.monotonic() + 10.0
    while not received and time.monotonic() < deadline:
        received = [d.data for d in await consumer.fetch(10, 0.2)]
    assert received == [b"after"]
    await consumer.close()
    await bus.close()


class _Warnings:
    """Stands in for a module's logger: keeps what it warns about."""

    def __init__(self, warned: list[str]) -> None:
        self.warned = warned

    def warning(self, event: str, **_: Any) -> None:
        self.warned.append(event)

    def info(self, event: str, **_: Any) -> None:
        pass


async def test_an_answer_read_late_is_not_taken_for_silence(
    nats_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Virtual nodes run a thousand consumers on one connection: when the process falls behind,
    # the answer to an expired request is read late, and the consumer was declared again for
    # nothing, adding to the load that made it late.
    bus = await connect(nats_server)
    await bus.ensure_topology(TOPOLOGY)
    consumer = await bus.consume(ConsumerSpec(stream=STREAM, durable="late", ack_wait_s=2.0))
    broker = nats_server.pid
    assert broker is not None
    warnings: list[str] = []
    monkeypatch.setattr(nats_consumer, "_log", _Warnings(warnings))
    os.kill(broker, signal.SIGSTOP)  # the broker falls behind: it answers nothing for a while
    try:
        assert await consumer.fetch(10, 0.2) == []
        await asyncio.sleep(1.5)  # pause under test: past the request's expiry and the grace
    finally:
        os.kill(broker, signal.SIGCONT)
    # This process is busy meanwhile (blocking on purpose): the broker's answer waits unread.
    time.sleep(0.5)  # noqa: ASYNC251 (pause under test)
    assert await consumer.fetch(10, 0.2) == []
    assert warnings == []
    await bus.publish("bustest.ping.a", b"later", msg_id="later")
    received: list[bytes] = []
    deadline = time.monotonic() + 10.0
    while not received and time.monotonic() < deadline:
        received = [d.data for d in await consumer.fetch(10, 0.2)]
    assert received == [b"later"]
    assert warnings == []
    await consumer.close()
    await bus.close()


async def test_a_consumer_silent_while_the_broker_stalls_is_looked_up_not_declared_again(
    nats_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stalled broker answers nothing, not even a round trip: the consumer is there all along,
    # and a declaration sent then only queues up more work for the broker (1,000 virtual nodes
    # declared theirs ~10,000 times in 5 minutes).
    bus = await connect(nats_server)
    await bus.ensure_topology(TOPOLOGY)
    consumer = await bus.consume(ConsumerSpec(stream=STREAM, durable="stall", ack_wait_s=2.0))
    declared: list[str] = []
    add_consumer = bus._js.add_consumer

    async def counted(stream: str, config: Any = None, **kwargs: Any) -> Any:
        declared.append(stream)
        return await add_consumer(stream, config, **kwargs)

    monkeypatch.setattr(bus._js, "add_consumer", counted)
    broker = nats_server.pid
    assert broker is not None
    os.kill(broker, signal.SIGSTOP)
    try:
        stalled_until = time.monotonic() + 3.5  # past the expiry, the grace and a look-up
        while time.monotonic() < stalled_until:
            assert await consumer.fetch(10, 0.2) == []
    finally:
        os.kill(broker, signal.SIGCONT)
    await bus.publish("bustest.ping.a", b"later", msg_id="later")
    received: list[bytes] = []
    deadline = time.monotonic() + 15.0
    while not received and time.monotonic() < deadline:
        received = [d.data for d in await consumer.fetch(10, 0.2)]
    assert received == [b"later"]
    assert declared == []
    await consumer.close()
    await bus.close()


async def test_consumers_deleted_together_are_declared_again_a_few_at_a_time(
    nats_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every consumer of a connection goes silent together after a stall: their look-ups and
    # declarations go to the broker a few at a time, not all at once.
    bus = await connect(nats_server)
    await bus.ensure_topology(TOPOLOGY)
    specs = [ConsumerSpec(stream=STREAM, durable=f"many{i}", ack_wait_s=2.0) for i in range(12)]
    consumers = [await bus.consume(spec) for spec in specs]
    at_once = 0
    most = 0
    consumer_info = bus._js.consumer_info
    add_consumer = bus._js.add_consumer

    async def watched(call: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal at_once, most
        at_once += 1
        most = max(most, at_once)
        try:
            await asyncio.sleep(0.05)  # pause under test: a slow call, the others pile up
            return await call(*args, **kwargs)
        finally:
            at_once -= 1

    async def info(*args: Any, **kwargs: Any) -> Any:
        return await watched(consumer_info, *args, **kwargs)

    async def add(*args: Any, **kwargs: Any) -> Any:
        return await watched(add_consumer, *args, **kwargs)

    monkeypatch.setattr(bus._js, "consumer_info", info)
    monkeypatch.setattr(bus._js, "add_consumer", add)
    for spec in specs:
        await bus.client.jetstream().delete_consumer(STREAM, spec.durable)
    await bus.publish("bustest.ping.a", b"after", msg_id="after")

    async def first(consumer: Any) -> list[bytes]:
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:
            if received := [d.data for d in await consumer.fetch(10, 0.2)]:
                return received
        return []

    assert await asyncio.gather(*(first(c) for c in consumers)) == [[b"after"]] * len(specs)
    assert 1 <= most <= nats_bus.RECOVERIES_AT_ONCE, most
    for consumer in consumers:
        await consumer.close()
    await bus.close()


async def test_a_deleted_consumer_is_declared_again_and_events_keep_coming(
    nats_server: EmbeddedNatsServer,
) -> None:
    bus = await connect(nats_server)
    await bus.ensure_topology(TOPOLOGY)
    handled: list[str] = []
    service = Service("counter")

    @service.handler(ConsumerSpec(stream=STREAM, durable="counter", ack_wait_s=2.0))
    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        handled.append(data.key)
        return []

    tool = EventPublisher(bus, "tool")
    async with ServiceRuntime(service, bus, settings=FAST, extra_topology=TOPOLOGY):
        await tool.publish(Pinged(key="before"))
        await eventually(lambda: "before" in handled)
        # Pause under test: its fetch waits on the server again (nothing says when it does).
        await asyncio.sleep(0.1)
        await bus.client.jetstream().delete_consumer(STREAM, "counter")  # an operator's doing
        await tool.publish(Pinged(key="after"))
        await eventually(lambda: "after" in handled)
    await bus.close()


async def test_a_connection_ensures_each_stream_and_bucket_once(
    nats_server: EmbeddedNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Many services on one connection (virtual nodes, one per server) declare the same
    # streams and buckets: asking JetStream about them once is enough.
    bus = await connect(nats_server)
    asked: list[str] = []
    stream_info = bus._js.stream_info

    async def counted(name: str, *args: object, **kwargs: object) -> object:
        asked.append(name)
        return await stream_info(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(bus._js, "stream_info", counted)
    await bus.ensure_topology(TOPOLOGY)
    first = len(asked)
    await bus.ensure_topology(TOPOLOGY)
    await bus.ensure_topology(Topology(streams=(TEST_STREAM,)))
    assert first >= 1 and len(asked) == first
    await bus.close()
