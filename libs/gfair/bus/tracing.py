"""W3C trace context in NATS headers, and the producer and consumer spans of the runtime.

A publisher's span context is injected into the message headers; the handler's span is
started with that context as parent, so a job's life (submitted, placed, started, ...) is
one trace across every service it passes through (DESIGN 3.2). Attributes follow the
OpenTelemetry messaging semantic conventions.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.trace import Span, SpanKind, Tracer

from gfair.events.envelope import Envelope

TRACER_NAME = "gfair.bus"


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


def extract_context(headers: Mapping[str, str]) -> Context:
    return propagate.extract(headers, getter=_GETTER)


def default_tracer() -> Tracer:
    # A proxy until a provider is configured, so tracers made at import time still work.
    return trace.get_tracer(TRACER_NAME)


def _event_attributes(envelope: Envelope) -> dict[str, str]:
    attributes = {"messaging.message.id": envelope.id, "gfair.event.type": envelope.type}
    if envelope.correlation_id:
        attributes["messaging.message.conversation_id"] = envelope.correlation_id
    if envelope.causation_id:
        attributes["gfair.event.causation_id"] = envelope.causation_id
    return attributes


@contextmanager
def publish_span(
    tracer: Tracer, subject: str, envelope: Envelope, body_size: int
) -> Iterator[Span]:
    """The producer span of one publish; inject inside it so consumers become its children."""
    with tracer.start_as_current_span(
        f"publish {envelope.type}",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "nats",
            "messaging.operation": "publish",
            "messaging.operation.name": "publish",
            "messaging.operation.type": "send",
            "messaging.destination.name": subject,
            "messaging.message.body.size": body_size,
            **_event_attributes(envelope),
        },
    ) as span:
        yield span


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
