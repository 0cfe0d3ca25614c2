"""Traces across the bus, structured logs with trace ids, and the span exporters."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gfair.bus.logs import configure_logging
from gfair.bus.observability import ObservabilitySettings, configure_observability
from gfair.bus.publisher import EventPublisher
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.service import Emit, Service
from gfair.bus.span_file import JsonlSpanExporter
from gfair.bus.topology import ConsumerSpec, Topology
from gfair.bus.tracing import extract_context, inject_context
from gfair.bus.transport import Bus
from gfair.events.envelope import Envelope
from support.waiting import eventually

from .conftest import FAST
from .events import STREAM, TEST_STREAM, Pinged, Ponged

PINGS = ConsumerSpec(
    stream=STREAM, durable="pinger", filter_subjects=("bustest.ping.*",), max_attempts=1
)


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    (found,) = [s for s in spans if s.name == name]
    return found


async def test_a_trace_started_by_a_publisher_continues_in_the_handler(
    bus: Bus, tracer_provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    tracer = tracer_provider.get_tracer("test")
    service = Service("ponger")

    @service.handler(PINGS)
    async def on_ping(envelope: Envelope, data: Pinged) -> list[Emit]:
        return [Emit(Ponged(key=data.key))]

    runtime = ServiceRuntime(
        service, bus, tracer=tracer, settings=FAST, extra_topology=Topology(streams=(TEST_STREAM,))
    )
    async with runtime:
        with tracer.start_as_current_span("gfair submit") as root:
            ping = await EventPublisher(bus, "cli", tracer=tracer).publish(Pinged(key="a"))
        await eventually(
            lambda: any(
                s.name == "publish gfair.test.ponged.v1" for s in spans.get_finished_spans()
            )
        )
        await bus.publish("bustest.ping.b", b"garbage", msg_id="garbage")  # no trace context
        await eventually(lambda: len(spans.get_finished_spans()) == 5)
    finished = list(spans.get_finished_spans())
    produce = one(finished, "publish gfair.test.pinged.v1")
    process = one(finished, "process gfair.test.pinged.v1")
    reply = one(finished, "publish gfair.test.ponged.v1")
    trace_id = root.get_span_context().trace_id
    assert {s.context.trace_id for s in (produce, process, reply)} == {trace_id}
    assert produce.parent is not None and produce.parent.span_id == root.get_span_context().span_id
    assert process.parent is not None and process.parent.span_id == produce.context.span_id
    assert reply.parent is not None and reply.parent.span_id == process.context.span_id
    assert (produce.kind, process.kind) == (SpanKind.PRODUCER, SpanKind.CONSUMER)
    assert produce.attributes is not None and process.attributes is not None
    assert produce.attributes["messaging.system"] == "nats"
    assert produce.attributes["messaging.destination.name"] == "bustest.ping.a"
    assert produce.attributes["messaging.message.id"] == ping.id
    assert produce.attributes["messaging.operation.type"] == "send"
    assert process.attributes["messaging.operation.type"] == "process"
    assert process.attributes["messaging.consumer.group.name"] == "pinger"
    assert process.attributes["messaging.message.id"] == ping.id
    assert process.attributes["gfair.event.type"] == Pinged.EVENT_TYPE
    assert process.attributes["gfair.outcome"] == "handled"
    garbage = one(finished, "process bustest.ping.b")
    assert garbage.parent is None and garbage.context.trace_id != trace_id  # a new trace
    assert garbage.status.status_code is StatusCode.ERROR
    assert garbage.attributes is not None
    assert garbage.attributes["gfair.dead_letter.reason"] == "undecodable"


def test_trace_context_round_trips_through_headers(tracer_provider: TracerProvider) -> None:
    tracer = tracer_provider.get_tracer("test")
    headers: dict[str, str] = {}
    with tracer.start_as_current_span("producer") as span:
        inject_context(headers)
    assert headers["traceparent"].split("-")[1] == f"{span.get_span_context().trace_id:032x}"
    shouted = {k.upper(): v for k, v in headers.items()}  # some brokers change header case
    with tracer.start_as_current_span("consumer", context=extract_context(shouted)) as child:
        assert child.get_span_context().trace_id == span.get_span_context().trace_id


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("restore_logging")
def test_json_logs_carry_the_current_trace_and_span(tracer_provider: TracerProvider) -> None:
    out = io.StringIO()
    configure_logging("placement", level="DEBUG", stream=out)
    log = structlog.get_logger("test")
    with tracer_provider.get_tracer("test").start_as_current_span("handle") as span:
        log.info("job placed", job="j1")
    log.info("idle")
    logging.getLogger("nats").warning("from the standard library")
    inside, outside, stdlib = (json.loads(line) for line in out.getvalue().splitlines())
    context = span.get_span_context()
    assert inside["trace_id"] == f"{context.trace_id:032x}"
    assert inside["span_id"] == f"{context.span_id:016x}"
    assert (inside["event"], inside["job"], inside["service"]) == ("job placed", "j1", "placement")
    assert inside["level"] == "info" and "timestamp" in inside
    assert "trace_id" not in outside
    assert stdlib["event"] == "from the standard library" and stdlib["service"] == "placement"


def test_jsonl_exporter_writes_one_object_per_span(tmp_path: Path) -> None:
    path = tmp_path / "spans" / "spans.jsonl"
    provider = TracerProvider(resource=Resource.create({"service.name": "profiler"}))
    provider.add_span_processor(SimpleSpanProcessor(JsonlSpanExporter(path)))
    tracer = provider.get_tracer("test")
    with (
        tracer.start_as_current_span("parent", attributes={"tags": ("a", "b")}) as parent,
        tracer.start_as_current_span("child") as child,
    ):
        child.set_status(StatusCode.ERROR, "boom")
    provider.shutdown()
    child_rec, parent_rec = (json.loads(line) for line in path.read_text().splitlines())
    assert parent_rec["name"] == "parent" and parent_rec["parent_span_id"] is None
    assert parent_rec["attributes"] == {"tags": ["a", "b"]}
    assert parent_rec["service.name"] == "profiler"
    assert child_rec["parent_span_id"] == f"{parent.get_span_context().span_id:016x}"
    assert child_rec["trace_id"] == parent_rec["trace_id"]
    assert child_rec["status"] == {"code": "ERROR", "description": "boom"}
    assert child_rec["start_ns"] <= child_rec["end_ns"]


@pytest.mark.usefixtures("restore_logging")
def test_configure_observability_picks_the_exporter_from_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "spans.jsonl"
    monkeypatch.setenv("GFAIR_SPAN_FILE", str(path))
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    settings = ObservabilitySettings()
    assert settings.chosen_exporter() == "jsonl"
    observability = configure_observability("stride", settings, set_global=False)
    with observability.tracer.start_as_current_span("quantum"):
        pass
    observability.shutdown()
    (record,) = (json.loads(line) for line in path.read_text().splitlines())
    assert (record["name"], record["service.name"]) == ("quantum", "stride")

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert ObservabilitySettings().chosen_exporter() == "otlp"
    assert ObservabilitySettings(traces_exporter="none").chosen_exporter() == "none"
    monkeypatch.delenv("GFAIR_SPAN_FILE")
    with pytest.raises(ValueError, match="GFAIR_SPAN_FILE"):
        ObservabilitySettings(traces_exporter="jsonl").chosen_exporter()
