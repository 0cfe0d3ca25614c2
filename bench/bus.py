"""The bus runtime's cost: publish-to-handle latency and throughput on loopback.

Run: ``.venv/bin/python -m bench.bus [--events 2000] [--publishers 1 8] [--time-limit 30]``

Starts its own nats-server (JetStream, file storage, in a temporary directory) and measures,
in the same run, with the producer and the consumer on separate connections:

- core NATS pub/sub: fire-and-forget publish, subscription callback (no storage, no acks);
- raw JetStream: ``js.publish`` (awaiting the store ack) + durable pull consumer, ``fetch`` in
  batches of 10, ``ack`` each: what the runtime does, without it;
- the gfair runtime: ``EventPublisher.publish`` (envelope, trace context, ``Nats-Msg-Id``) ->
  ``HandlerRunner`` (decode, validate against the registry, tenant subject check, consumer span,
  handler, ack), with the no-op tracer, and again with an SDK tracer provider exporting through
  a batch processor (to a discarding exporter), i.e. with tracing on.

Every path carries the same event (a ``NodeHeartbeat`` envelope, ~300 bytes). Latency is from
the call to publish to the start of handling; events/s is events over the time from the first
publish to the last handled; cpu us/ev is this process's CPU time (producer and consumer
together) per event. Each publisher awaits its publish before the next, as services do; core
NATS publishes do not wait for anything, so its latency is the queue behind the whole burst.
With 8 publishers the consumers fall behind and latency is mostly queueing. Producer and
consumer share one process and event loop (and, on a small machine, the server's cores), so
the numbers are a lower bound on what separate processes achieve. Each run is bounded by
``--time-limit``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import nats
from nats.aio.msg import Msg
from nats.js import api
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Tracer

from gfair.bus.logs import configure_logging
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.publisher import EventPublisher
from gfair.bus.runner import RunnerSettings
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.server import EmbeddedNatsServer, NatsServerConfig
from gfair.bus.service import Emit, Service
from gfair.bus.topology import ConsumerSpec, Topology, contract_streams
from gfair.bus.tracing import default_tracer
from gfair.bus.wire import encode
from gfair.events import Envelope, NodeHeartbeat

STREAM = "GFAIR_NODES"
BATCH = 10


@dataclass
class Result:
    path: str
    publishers: int
    sent: int
    handled: int
    seconds: float
    latencies_ms: list[float]
    cpu_s: float = 0.0

    def row(self) -> str:
        lat = sorted(self.latencies_ms)
        p50 = statistics.median(lat) if lat else float("nan")
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan")
        rate = self.handled / self.seconds if self.seconds > 0 else float("nan")
        cpu_us = self.cpu_s / self.handled * 1e6 if self.handled else float("nan")
        lost = "" if self.handled == self.sent else f"  (handled {self.handled}/{self.sent})"
        return (
            f"{self.path:<34} {self.publishers:>4} {self.handled:>7} {rate:>10,.0f}"
            f" {p50:>8.3f} {p99:>8.3f} {cpu_us:>9.0f}{lost}"
        )


class Clock:
    """Publish start times by sequence number, and the latency of each handled one."""

    def __init__(self, events: int) -> None:
        self.started = [0] * events
        self.latencies_ms: list[float] = []
        self.first = 0
        self.last = 0
        self.done = asyncio.Event()
        self._remaining = events

    def mark_sent(self, seq: int) -> None:
        now = time.perf_counter_ns()
        self.started[seq] = now
        if self.first == 0:
            self.first = now

    def mark_handled(self, seq: int) -> None:
        now = time.perf_counter_ns()
        self.latencies_ms.append((now - self.started[seq]) / 1e6)
        self.last = now
        self._remaining -= 1
        if self._remaining == 0:
            self.done.set()

    def result(self, path: str, publishers: int, events: int) -> Result:
        seconds = (self.last - self.first) / 1e9 if self.last else 0.0
        return Result(path, publishers, events, len(self.latencies_ms), seconds, self.latencies_ms)


def heartbeat(run: str, seq: int) -> NodeHeartbeat:
    # One node id per run: each run's consumer sees only its own events.
    return NodeHeartbeat(node_id=run, seq=seq)


def raw_payload(run: str, seq: int) -> bytes:
    """The same bytes the runtime would send, so only the handling differs."""
    return encode(Envelope.wrap(heartbeat(run, seq), source="bench"))[0]


def seq_of(payload: bytes) -> int:
    # Cheap on purpose: the raw paths measure the transport, not JSON parsing.
    marker = payload.index(b'"seq":') + 6
    return int(payload[marker : payload.index(b",", marker)])


async def produce(
    clock: Clock, events: int, publishers: int, publish: Callable[[int], Awaitable[object]]
) -> None:
    async def worker(offset: int) -> None:
        for seq in range(offset, events, publishers):
            clock.mark_sent(seq)
            await publish(seq)

    await asyncio.gather(*(worker(i) for i in range(publishers)))


async def wait_done(clock: Clock, time_limit: float) -> None:
    with contextlib.suppress(TimeoutError):  # reported as "handled n/m"
        await asyncio.wait_for(clock.done.wait(), time_limit)


async def bench_core(url: str, events: int, publishers: int, time_limit: float) -> Result:
    clock = Clock(events)
    payloads = [raw_payload(f"core-{publishers}", i) for i in range(events)]
    sub_nc, pub_nc = await nats.connect(url), await nats.connect(url)

    async def on_msg(msg: Msg) -> None:
        clock.mark_handled(seq_of(msg.data))

    await sub_nc.subscribe("bench.core", cb=on_msg)
    await sub_nc.flush()
    await produce(clock, events, publishers, lambda i: pub_nc.publish("bench.core", payloads[i]))
    await pub_nc.flush()
    await wait_done(clock, time_limit)
    await pub_nc.close()
    await sub_nc.close()
    return clock.result("core NATS pub/sub (no storage)", publishers, events)


async def bench_raw_jetstream(url: str, events: int, publishers: int, time_limit: float) -> Result:
    clock = Clock(events)
    durable = f"raw-{publishers}"
    subject = heartbeat(durable, 0).subject()
    payloads = [raw_payload(durable, i) for i in range(events)]
    sub_nc, pub_nc = await nats.connect(url), await nats.connect(url)
    js_pub, js_sub = pub_nc.jetstream(), sub_nc.jetstream()
    await js_sub.add_consumer(
        STREAM,
        api.ConsumerConfig(
            name=durable,
            durable_name=durable,
            deliver_policy=api.DeliverPolicy.NEW,
            ack_policy=api.AckPolicy.EXPLICIT,
            filter_subject=subject,
        ),
    )
    sub = await js_sub.pull_subscribe_bind(durable=durable, stream=STREAM)

    async def consume() -> None:
        while not clock.done.is_set():
            try:
                msgs = await sub.fetch(BATCH, timeout=1.0)
            except nats.errors.TimeoutError:
                continue
            for msg in msgs:
                clock.mark_handled(seq_of(msg.data))
                await msg.ack()

    consumer = asyncio.create_task(consume())
    await produce(
        clock,
        events,
        publishers,
        lambda i: js_pub.publish(subject, payloads[i], headers={"Nats-Msg-Id": f"{durable}-{i}"}),
    )
    await wait_done(clock, time_limit)
    consumer.cancel()
    await pub_nc.close()
    await sub_nc.close()
    return clock.result("raw JetStream publish + pull + ack", publishers, events)


class _Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


async def bench_runtime(
    url: str,
    events: int,
    publishers: int,
    time_limit: float,
    *,
    traced: bool,
) -> Result:
    clock = Clock(events)
    provider: TracerProvider | None = None
    tracer: Tracer = default_tracer()
    if traced:
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(_Discard()))
        tracer = provider.get_tracer("bench")
    options = NatsOptions(servers=(url,))
    consumer_bus, producer_bus = await NatsBus.connect(options), await NatsBus.connect(options)
    service = Service("bench")
    durable = f"runtime-{publishers}-{'traced' if traced else 'plain'}"
    subject = heartbeat(durable, 0).subject()

    @service.handler(ConsumerSpec(stream=STREAM, durable=durable, filter_subjects=(subject,)))
    async def on_heartbeat(envelope: Envelope, data: NodeHeartbeat) -> list[Emit]:
        clock.mark_handled(data.seq)
        return []

    runtime = ServiceRuntime(
        service,
        consumer_bus,
        tracer=tracer,
        settings=RunnerSettings(batch=BATCH, fetch_timeout_s=1.0),
    )
    publisher = EventPublisher(producer_bus, "bench", tracer=tracer)
    data = [heartbeat(durable, i) for i in range(events)]
    async with runtime:
        await produce(clock, events, publishers, lambda i: publisher.publish(data[i]))
        await wait_done(clock, time_limit)
    await producer_bus.close()
    await consumer_bus.close()
    if provider is not None:
        provider.shutdown()
    name = "gfair runtime, tracing on" if traced else "gfair runtime (no-op tracer)"
    return clock.result(name, publishers, events)


async def main_async(args: argparse.Namespace) -> None:
    # Per-event debug lines would measure the terminal, not the bus.
    configure_logging("bench", level="WARNING", fmt="console")
    with tempfile.TemporaryDirectory(prefix="gfair-bench-bus-") as store:
        server = EmbeddedNatsServer(NatsServerConfig(store_dir=Path(store)))
        url = server.start()
        try:
            setup = await NatsBus.connect(NatsOptions(servers=(url,)))
            await setup.ensure_topology(Topology(streams=contract_streams()))
            await setup.close()
            print(f"nats-server on {url}, file storage; {args.events} events per run\n")
            print(
                f"{'path':<34} {'pubs':>4} {'events':>7} {'events/s':>10}"
                f" {'p50 ms':>8} {'p99 ms':>8} {'cpu us/ev':>9}"
            )
            rows: dict[tuple[str, int], Result] = {}
            for publishers in args.publishers:
                runs = (
                    bench_core(url, args.events, publishers, args.time_limit),
                    bench_raw_jetstream(url, args.events, publishers, args.time_limit),
                    bench_runtime(url, args.events, publishers, args.time_limit, traced=False),
                    bench_runtime(url, args.events, publishers, args.time_limit, traced=True),
                )
                for run in runs:
                    cpu = time.process_time()
                    result = await run
                    result.cpu_s = time.process_time() - cpu
                    rows[(result.path, publishers)] = result
                    print(result.row(), flush=True)
                print()
            for publishers in args.publishers:
                raw = rows[("raw JetStream publish + pull + ack", publishers)]
                ours = rows[("gfair runtime (no-op tracer)", publishers)]
                if raw.latencies_ms and ours.latencies_ms and raw.seconds and ours.seconds:
                    latency = statistics.median(ours.latencies_ms) / statistics.median(
                        raw.latencies_ms
                    )
                    rate = (ours.handled / ours.seconds) / (raw.handled / raw.seconds)
                    print(
                        f"runtime vs raw JetStream, {publishers} publisher(s): "
                        f"p50 latency x{latency:.2f}, throughput x{rate:.2f}"
                    )
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000, help="events per run")
    parser.add_argument(
        "--publishers", type=int, nargs="+", default=[1, 8], help="concurrent publishers"
    )
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per run at most")
    args = parser.parse_args()
    if args.events < 1:
        parser.error("--events must be >= 1")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
