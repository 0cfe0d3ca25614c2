"""W3C trace context in NATS headers, and the producer and consumer spans of the runtime.

A publisher's span context is injected into the message headers; the handler's span is
started with that context as parent, so a job's life (submitted, placed, started, ...) is
one trace across every service it passes through (docs/design.md §3.2). Attributes follow the
OpenTelemetry messaging semantic conventions, plus the job's own (`job_attributes`:
``gfair.job.id``, ``gfair.user``, ``gfair.node``, ...) read from the payload, so any span
about a job can be found by its id.

Events that no handled event caused (a quantum's commands, a job process's reports) would
each start a trace of their own. A service keeps the W3C ``traceparent`` of a job's trace
(`current_traceparent()` inside a handler) and passes it back when it publishes about that
job later (`Emit(trace_parent=...)`, `EventPublisher.publish(trace_parent=...)`): the publish
then joins the job's trace, linked to the span that actually caused it (a quantum tick).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import (
    Link,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    Tracer,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from gfair.events.envelope import Envelope

TRACER_NAME = "gfair.bus"
TRACEPARENT = "traceparent"
# Whatever propagator the process configured, a stored traceparent is W3C trace context.
_W3C = TraceContextTextMapPropagator()
_IDS = RandomIdGenerator()
_MAX_TEXT_CHARS = 256

# Payload field -> span attribute: what identifies a job, where it runs and why it stopped.
# `server` is ScheduleDecided's node. GPU counts and lists are handled in `job_attributes`.
_JOB_FIELDS: dict[str, str] = {
    "user": "gfair.user",
    "job_id": "gfair.job.id",
    "node_id": "gfair.node",
    "server": "gfair.node",
    "to_node": "gfair.to_node",
    "from_node": "gfair.from_node",
    "generation": "gfair.generation",
    "attempt": "gfair.attempt",
    "failure_class": "gfair.failure_class",
    "quantum": "gfair.quantum",
    "reason": "gfair.reason",
}


class NatsHeaderGetter(Getter[Mapping[str, str]]):
    """Reads propagation fields; header names compare case-insensitively, as in HTTP."""

    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        value = carrier.get(key)
        if value is None:
            lowered = key.lower()
            for name, candidate in carrier.items():
                if name.lower() == lowered:
                    value = candidate
                    break
        return None if value is None else [value]

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return list(carrier)


class NatsHeaderSetter(Setter[MutableMapping[str, str]]):
    def set(self, carrier: MutableMapping[str, str], key: str, value: str) -> None:
        carrier[key] = value


_GETTER = NatsHeaderGetter()
_SETTER = NatsHeaderSetter()


def inject_context(headers: MutableMapping[str, str], context: Context | None = None) -> None:
    """Write the current (or given) trace context into `headers` (traceparent, tracestate)."""
    propagate.inject(headers, context=context, setter=_SETTER)


def propagated_context(span: Span) -> Context | None:
    """What to inject for a message published under `span`: its context (None: the current
    one), or a new sampled root when it has none.

    A tool that exports no spans (the `gfair` CLI, a user's script) has a no-op tracer and no
    trace upstream: its publishes would carry no context, and every service consuming the
    same submission would start a trace of its own. With a root made up here they all join
    one trace, whose root span simply was never exported.
    """
    if span.get_span_context().is_valid:
        return None
    root = SpanContext(
        trace_id=_IDS.generate_trace_id(),
        span_id=_IDS.generate_span_id(),
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(root))


def extract_context(headers: Mapping[str, str]) -> Context:
    return propagate.extract(headers, getter=_GETTER)


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span; None outside a sampled, valid span.

    Inside a handler this is its consumer span: store it with the job's state and pass it as
    `trace_parent` when publishing about that job later, to continue the job's trace.
    """
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier.get(TRACEPARENT)


def traceparent_span_context(traceparent: str | None) -> SpanContext | None:
    """The remote span context a traceparent names; None when absent or malformed."""
    if not traceparent:
        return None
    context = _W3C.extract({TRACEPARENT: traceparent})
    span_context = trace.get_current_span(context).get_span_context()
    return span_context if span_context.is_valid else None


def trace_links(traceparents: Iterable[str | None]) -> list[Link]:
    """Links to the spans these traceparents name (malformed or missing ones are skipped)."""
    links = []
    for traceparent in traceparents:
        span_context = traceparent_span_context(traceparent)
        if span_context is not None:
            links.append(Link(span_context))
    return links


def join_trace(trace_parent: str | None) -> tuple[Context | None, list[Link]]:
    """Parent context and links for a span that belongs to the trace of `trace_parent`.

    Already inside that trace (a handler of one of the job's own events): keep the current
    span as parent, which records the causal chain. Elsewhere (a timer, or a handler of
    another trace): parent the span on `trace_parent` and link the current span, the cause.
    None (or a malformed traceparent) changes nothing: the current context is the parent.
    """
    wanted = traceparent_span_context(trace_parent)
    if wanted is None:
        return None, []
    current = trace.get_current_span().get_span_context()
    if current.is_valid and current.trace_id == wanted.trace_id:
        return None, []
    parent = trace.set_span_in_context(trace.NonRecordingSpan(wanted), Context())
    return parent, [Link(current)] if current.is_valid else []


@contextmanager
def span_in_trace(
    tracer: Tracer,
    name: str,
    trace_parent: str | None,
    *,
    attributes: Mapping[str, AttributeValue] | None = None,
    links: Iterable[str | None] = (),
    kind: SpanKind = SpanKind.INTERNAL,
) -> Iterator[Span]:
    """A current span in the trace of `trace_parent` (see `join_trace`), e.g. a quantum's
    decision about one job, in that job's trace, linked to the tick that made it."""
    parent, cause = join_trace(trace_parent)
    with tracer.start_as_current_span(
        name,
        context=parent,
        kind=kind,
        attributes=attributes,
        links=[*cause, *trace_links(links)],
    ) as span:
        yield span


def job_attributes(data: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """Span attributes naming the job (and node, pool, failure class) an event payload is about."""
    attributes: dict[str, AttributeValue] = {}
    for field, attribute in _JOB_FIELDS.items():
        value = data.get(field)
        if isinstance(value, str):
            # Reasons may run to kilobytes; the event keeps the whole text.
            attributes.setdefault(attribute, value[:_MAX_TEXT_CHARS])
        elif isinstance(value, int | float) and not isinstance(value, bool):
            attributes.setdefault(attribute, value)
    gpus = data.get("gpus")
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        attributes["gfair.gpus"] = gpus
    indices = data.get("gpu_indices")
    if isinstance(indices, list | tuple) and all(isinstance(i, int) for i in indices):
        attributes["gfair.gpus"] = len(indices)
        attributes["gfair.gpu.indices"] = [int(i) for i in indices]
    servers = data.get("servers")
    if isinstance(servers, list | tuple) and all(isinstance(s, str) for s in servers):
        attributes["gfair.servers"] = [str(s) for s in servers]
    return attributes


def default_tracer() -> Tracer:
    # A proxy until a provider is configured, so tracers made at import time still work.
    return trace.get_tracer(TRACER_NAME)


def _event_attributes(envelope: Envelope) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = job_attributes(envelope.data)
    attributes["messaging.message.id"] = envelope.id
    attributes["gfair.event.type"] = envelope.type
    if envelope.correlation_id:
        attributes["messaging.message.conversation_id"] = envelope.correlation_id
    if envelope.causation_id:
        attributes["gfair.event.causation_id"] = envelope.causation_id
    return attributes


@contextmanager
def publish_span(
    tracer: Tracer,
    subject: str,
    envelope: Envelope,
    body_size: int,
    *,
    trace_parent: str | None = None,
    links: Iterable[str | None] = (),
) -> Iterator[Span]:
    """The producer span of one publish; inject inside it so consumers become its children.

    `trace_parent` puts it in that trace (`join_trace`); `links` link other traces to it.
    """
    parent, cause = join_trace(trace_parent)
    with tracer.start_as_current_span(
        f"publish {envelope.type}",
        context=parent,
        kind=SpanKind.PRODUCER,
        links=[*cause, *trace_links(links)],
        attributes={
            "messaging.system": "nats",
            "messaging.operation": "publish",
            "messaging.operation.name": "publish",
            "messaging.operation.type": "send",
            "messaging.destination.name": subject,
            "messaging.message.body.size": body_size,
            **_event_attributes(envelope),
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as exc:
            # Recorded without its traceback: formatting one costs more than a publish, and a
            # broker too busy to acknowledge fails a quantum's hundreds of commands at once.
            span.add_event(
                "exception",
                {"exception.type": type(exc).__qualname__, "exception.message": str(exc)},
            )
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__qualname__}: {exc}"))
            raise


@contextmanager
def process_span(
    tracer: Tracer,
    *,
    subject: str,
    headers: Mapping[str, str],
    consumer: str,
    stream: str,
    stream_sequence: int,
    attempt: int,
    body_size: int,
) -> Iterator[Span]:
    """The consumer span of handling one delivery, parented by the producer's context."""
    with tracer.start_as_current_span(
        f"process {subject}",
        context=extract_context(headers),
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": "nats",
            "messaging.operation": "process",
            "messaging.operation.name": "process",
            "messaging.operation.type": "process",
            "messaging.destination.name": subject,
            "messaging.consumer.group.name": consumer,
            "messaging.message.body.size": body_size,
            "gfair.stream": stream,
            "gfair.stream.sequence": stream_sequence,
            "gfair.delivery.attempt": attempt,
        },
    ) as span:
        yield span


def annotate_event(span: Span, envelope: Envelope) -> None:
    """Once the body is decoded, name the span after the event type and tag it."""
    span.update_name(f"process {envelope.type}")
    span.set_attributes(_event_attributes(envelope))
