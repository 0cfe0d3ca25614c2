"""Joining a job's trace from outside it: stored traceparents, links, job attributes, roots."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.publisher import EventPublisher
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.service import Emit, Service
from gfair.bus.topology import ConsumerSpec, Topology
from gfair.bus.tracing import (
    current_traceparent,
    job_attributes,
    publish_span,
    span_in_trace,
    traceparent_span_context,
)
from gfair.events.commands import StartCommand
from gfair.events.envelope import Envelope
from gfair.events.jobs import JobFailed, JobPlaced
from gfair.events.reasons import FailureClass
from support.waiting import eventually

from .conftest import FAST
from .events import STREAM, TEST_STREAM, Noted, Pinged, Ponged

PINGS = ConsumerSpec(stream=STREAM, durable="pinger", filter_subjects=("bustest.ping.*",))
EXTRA = Topology(streams=(TEST_STREAM,))


def named(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


def ids(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


def test_current_traceparent_names_the_current_span_and_parses_back(
    tracer_provider: TracerProvider,
) -> None:
    assert current_traceparent() is None  # no span: nothing to continue
    with tracer_provider.get_tracer("t").start_as_current_span("handler") as span:
        traceparent = current_traceparent()
    assert traceparent is not None
    parsed = traceparent_span_context(traceparent)
    assert parsed is not None
    context = span.get_span_context()
    assert (parsed.trace_id, parsed.span_id) == (context.trace_id, context.span_id)
    assert traceparent_span_context("00-not-a-trace-parent") is None
    assert traceparent_span_context(None) is None


async def test_a_timer_publishes_into_the_trace_it_is_given(
    tracer_provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    tracer = tracer_provider.get_tracer("t")
    with tracer.start_as_current_span("submission handled") as job_span:
        job_trace = current_traceparent()
    service = Service("ticker")
    emitted: list[Emit] = [
        Emit(Pinged(key="for-the-job"), trace_parent=job_trace),
        Emit(Pinged(key="no-job")),
    ]

    @service.timer(0.01)
    async def tick() -> list[Emit]:
        outputs, emitted[:] = list(emitted), []
        return outputs

    runtime = ServiceRuntime(
        service, InMemoryBus(), tracer=tracer, settings=FAST, extra_topology=EXTRA
    )
    async with runtime:
        await eventually(lambda: len(named(spans, "publish gfair.test.pinged.v1")) == 2)
    by_subject = {
        s.attributes["messaging.destination.name"]: s
        for s in named(spans, "publish gfair.test.pinged.v1")
        if s.attributes is not None
    }
    joined, alone = by_subject["bustest.ping.for-the-job"], by_subject["bustest.ping.no-job"]
    assert joined.parent is not None
    assert (joined.parent.trace_id, joined.parent.span_id) == ids(job_span)
    assert alone.parent is None and ids(alone)[0] != ids(job_span)[0]  # a trace of its own


async def test_an_untraced_emit_has_no_span_of_its_own_and_stays_in_its_trace(
    tracer_provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    tracer = tracer_provider.get_tracer("t")
    with tracer.start_as_current_span("run") as run_span:
        run_trace = current_traceparent()
    ticker = Service("ticker")
    emitted = [
        Emit(Pinged(key="report"), trace_parent=run_trace, traced=False),
        Emit(Pinged(key="heartbeat"), traced=False),
    ]

    @ticker.timer(0.01)
    async def tick() -> list[Emit]:
        outputs, emitted[:] = list(emitted), []
        return outputs

    reader = Service("reader")
    seen: list[str] = []

    @reader.handler(PINGS)
    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        seen.append(data.key)
        return []

    bus = InMemoryBus()
    producer = ServiceRuntime(ticker, bus, tracer=tracer, settings=FAST, extra_topology=EXTRA)
    consumer = ServiceRuntime(reader, bus, tracer=tracer, settings=FAST, extra_topology=EXTRA)
    async with producer, consumer:
        await eventually(lambda: sorted(seen) == ["heartbeat", "report"])
    assert named(spans, "publish gfair.test.pinged.v1") == []
    read = {
        s.attributes["messaging.destination.name"]: s
        for s in named(spans, "process gfair.test.pinged.v1")
        if s.attributes is not None
    }
    report, heartbeat = read["bustest.ping.report"], read["bustest.ping.heartbeat"]
    # The report's reader is in the run's trace, right under the run: no publish between.
    assert report.parent is not None and report.parent.span_id == ids(run_span)[1]
    assert ids(report)[0] == ids(run_span)[0]
    # Published in no trace at all, the heartbeat's reader starts one of its own.
    assert heartbeat.parent is None and ids(heartbeat)[0] != ids(run_span)[0]


async def test_a_handler_output_for_another_trace_joins_it_and_links_its_cause(
    tracer_provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    tracer = tracer_provider.get_tracer("t")
    with tracer.start_as_current_span("job A submitted") as job_a:
        job_a_trace = current_traceparent()
    service = Service("ponger")

    @service.handler(PINGS)
    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        own = current_traceparent()  # this handler's span, in the ping's trace
        return [
            Emit(Ponged(key="a"), trace_parent=job_a_trace),
            Emit(Ponged(key="same"), trace_parent=own),
            Emit(Ponged(key="broken"), trace_parent="garbage"),
        ]

    bus = InMemoryBus()
    runtime = ServiceRuntime(service, bus, tracer=tracer, settings=FAST, extra_topology=EXTRA)
    async with runtime:
        await EventPublisher(bus, "tool", tracer=tracer).publish(Pinged(key="p"))
        await eventually(lambda: len(named(spans, "publish gfair.test.ponged.v1")) == 3)
    (process,) = named(spans, "process gfair.test.pinged.v1")
    by_key = {
        s.attributes["messaging.destination.name"]: s
        for s in named(spans, "publish gfair.test.ponged.v1")
        if s.attributes is not None
    }
    into_a = by_key["bustest.pong.a"]
    assert into_a.parent is not None
    assert (into_a.parent.trace_id, into_a.parent.span_id) == ids(job_a)
    assert [(link.context.trace_id, link.context.span_id) for link in into_a.links] == [
        ids(process)
    ]
    # Already in the trace it names, or naming none that parses: the handler stays the parent.
    for key in ("bustest.pong.same", "bustest.pong.broken"):
        output = by_key[key]
        assert output.parent is not None and output.parent.span_id == ids(process)[1]
        assert not output.links


async def test_links_name_other_traces_and_a_span_in_trace_continues_one(
    tracer_provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    tracer = tracer_provider.get_tracer("t")
    parents = []
    for name in ("job 1", "job 2"):
        with tracer.start_as_current_span(name) as span:
            parents.append((span, current_traceparent()))
    bus = InMemoryBus()
    await bus.ensure_topology(EXTRA)
    with tracer.start_as_current_span("quantum") as tick:
        with span_in_trace(tracer, "decision", parents[0][1], attributes={"gfair.quantum": 7}):
            pass
        await EventPublisher(bus, "split-stride", tracer=tracer).publish(
            Pinged(key="server-1"), links=[parents[0][1], parents[1][1], None]
        )
    (decision,) = named(spans, "decision")
    assert decision.parent is not None
    assert (decision.parent.trace_id, decision.parent.span_id) == ids(parents[0][0])
    assert [link.context.span_id for link in decision.links] == [ids(tick)[1]]
    assert decision.attributes is not None and decision.attributes["gfair.quantum"] == 7
    (decided,) = named(spans, "publish gfair.test.pinged.v1")
    assert decided.parent is not None and decided.parent.span_id == ids(tick)[1]
    assert [(link.context.trace_id, link.context.span_id) for link in decided.links] == [
        ids(parents[0][0]),
        ids(parents[1][0]),
    ]


async def test_a_tool_that_traces_nothing_still_gives_every_consumer_one_trace(
    tracer_provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    bus = InMemoryBus()
    runtimes = []
    for name in ("placement", "failure-detector"):
        service = Service(name)

        async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
            return []

        service.add_handler(
            on_ping,
            ConsumerSpec(stream=STREAM, durable=name, filter_subjects=("bustest.ping.*",)),
        )
        runtimes.append(
            ServiceRuntime(
                service,
                bus,
                tracer=tracer_provider.get_tracer(name),
                settings=FAST,
                extra_topology=EXTRA,
            )
        )
    for runtime in runtimes:
        await runtime.start()
    try:
        # The CLI's tracer: the API's no-op one, exporting nothing.
        await EventPublisher(bus, "gfair-cli", tracer=trace.NoOpTracer()).publish(
            Pinged(key="submit")
        )
        await eventually(lambda: len(named(spans, "process gfair.test.pinged.v1")) == 2)
    finally:
        for runtime in runtimes:
            await runtime.stop()
    first, second = named(spans, "process gfair.test.pinged.v1")
    assert first.kind is second.kind is SpanKind.CONSUMER
    assert first.parent is not None and second.parent is not None
    assert first.parent.is_remote and first.parent.trace_flags.sampled
    assert ids(first)[0] == ids(second)[0]  # one trace, rooted at the tool's unexported span
    assert first.parent.span_id == second.parent.span_id


def test_job_attributes_come_from_the_payload() -> None:
    placed = JobPlaced(user="alice", job_id="j1", servers=("v100-0", "v100-1"), generation="v100")
    assert job_attributes(placed.model_dump(mode="json")) == {
        "gfair.user": "alice",
        "gfair.job.id": "j1",
        "gfair.generation": "v100",
        "gfair.servers": ["v100-0", "v100-1"],
    }
    start = StartCommand(
        node_id="v100-0",
        user="bob",
        job_id="j2",
        attempt=2,
        command=("python", "train.py"),
        gpu_indices=(2, 3),
        checkpoint_dir="/ckpt/bob/j2",
    )
    attributes = job_attributes(start.model_dump(mode="json"))
    assert attributes["gfair.node"] == "v100-0"
    assert attributes["gfair.gpus"] == 2 and attributes["gfair.gpu.indices"] == [2, 3]
    assert attributes["gfair.attempt"] == 2
    assert "gfair.command" not in attributes and "command" not in attributes
    failed = JobFailed(
        user="bob",
        job_id="j2",
        failure_class=FailureClass.USER_ERROR,
        reason="exit code 1",
        attempt=2,
    )
    assert job_attributes(failed.model_dump(mode="json"))["gfair.failure_class"] == "user_error"


async def test_untraced_events_get_no_span_and_their_outputs_join_the_producers_trace(
    tracer_provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    tracer = tracer_provider.get_tracer("t")
    service = Service("profiler-like")
    failed_once: list[str] = []

    async def on_event(envelope: Envelope, data: Pinged | Noted) -> list[Emit]:
        if isinstance(data, Pinged) and data.key == "flaky" and not failed_once:
            failed_once.append(envelope.id)
            raise RuntimeError("the first attempt fails")
        if isinstance(data, Pinged) and data.count > 0:
            return [Emit(Ponged(key=data.key, count=data.count))]
        return []

    service.add_handler(
        on_event,
        ConsumerSpec(
            stream=STREAM,
            durable="quiet",
            filter_subjects=("bustest.ping.*", "bustest.note.*"),
            max_attempts=3,
        ),
        untraced=(Pinged,),
    )
    bus = InMemoryBus()
    runtime = ServiceRuntime(service, bus, tracer=tracer, settings=FAST, extra_topology=EXTRA)
    node = EventPublisher(bus, "node", tracer=tracer)
    async with runtime:
        with tracer.start_as_current_span("job started") as job:
            await node.publish(Pinged(key="quiet"))
            await node.publish(Pinged(key="decides", count=2))
            await node.publish(Pinged(key="flaky"))
        await node.publish(Noted(key="traced"))
        await eventually(
            lambda: bus.backlog() == 0 and len(named(spans, "process gfair.test.noted.v1")) == 1
        )
    assert failed_once  # the failed attempt was retried and then handled
    assert named(spans, "process gfair.test.pinged.v1") == []  # none of the three had a span
    (output,) = named(spans, "publish gfair.test.ponged.v1")
    # Published in the job's trace, under the publish of the report that caused it.
    (cause,) = [
        s
        for s in named(spans, "publish gfair.test.pinged.v1")
        if s.attributes is not None
        and s.attributes["messaging.destination.name"] == "bustest.ping.decides"
    ]
    assert ids(output)[0] == ids(job)[0]
    assert output.parent is not None and output.parent.span_id == ids(cause)[1]


def test_a_failed_publish_span_says_why_without_a_traceback(
    tracer_provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    envelope = Envelope.wrap(Noted(key="x"), source="test")
    try:
        with publish_span(tracer_provider.get_tracer("t"), "bustest.noted", envelope, 3):
            raise TimeoutError("not acknowledged")
    except TimeoutError:
        pass
    (span,) = named(spans, f"publish {envelope.type}")
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "TimeoutError: not acknowledged"
    (event,) = span.events
    assert event.name == "exception"
    assert dict(event.attributes or {}) == {
        "exception.type": "TimeoutError",
        "exception.message": "not acknowledged",
    }
