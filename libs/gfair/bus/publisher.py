"""Publishing events: envelope, trace context, and the event id as JetStream's dedup key.

`publish` waits for the store's acknowledgement; `send` only starts the publish and returns the
task that waits for it, so that several events go out back to back (one write, one round trip
for all) while the caller goes on. Sends leave in the order they were made: each task reaches
the connection's buffer in its first step, and tasks take their first step in creation order.

A publish made with `persist` is not given up when the broker does not acknowledge it (after the
bus's own retries, `PublishFailed`): it goes out again under the same id while its publisher's
process runs, and JetStream drops the repeat if the first was stored after all. A busy broker
then delays an output instead of failing the work that made it.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import os
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypedDict, Unpack

import structlog
from opentelemetry.trace import Tracer

from gfair.bus.tracing import (
    default_tracer,
    inject_context,
    join_trace,
    propagated_context,
    publish_span,
)
from gfair.bus.transport import Bus, PubAck, PublishFailed
from gfair.bus.wire import encode
from gfair.events.envelope import Envelope, EventData

# Namespace of the ids derived for a handler's outputs from the id of the event that caused them.
_DERIVED_ID_NAMESPACE = uuid.UUID("5b0c1f0e-7c1a-4f52-9a3e-6f1a2b9d0c11")
EVENT_ID_KEY_VARIABLE = "GFAIR_EVENT_ID_KEY"
# Pause before publishing again an event the broker did not acknowledge (`persist`).
AGAIN_AFTER_S = 1.0

_log = structlog.get_logger("gfair.bus.publisher")


@functools.cache
def _event_id_key() -> bytes | None:
    # Read once: every id a process derives must come from the same key, or a redelivered
    # input's outputs would get new ids and be stored twice.
    text = os.environ.get(EVENT_ID_KEY_VARIABLE, "").strip()
    return text.encode() if text else None


def event_ids_are_keyed() -> bool:
    return _event_id_key() is not None


def derived_event_id(cause_id: str, index: int, event_type: str, subject: str) -> str:
    """Deterministic id of a handler's `index`-th output: the same on every redelivery.

    JetStream drops a message whose id it stored in the last two minutes, whoever published
    it, and tenants publish into the same stream as the services. Unkeyed, an id is a function
    of values a tenant can read (a submission's id, a quantum's number), so a tenant could
    publish first under it and have the service's event dropped as a duplicate. Keyed with
    `$GFAIR_EVENT_ID_KEY`, a secret the services and executors share, the id is an HMAC no
    tenant can compute; without a key (a cluster that lets everyone publish anything) it is
    the plain uuid5.
    """
    material = f"{cause_id}/{index}/{event_type}/{subject}"
    key = _event_id_key()
    if key is None:
        return uuid.uuid5(_DERIVED_ID_NAMESPACE, material).hex
    return hmac.new(key, material.encode(), hashlib.sha256).hexdigest()[:32]


class Sending(TypedDict, total=False):
    """How `EventPublisher.publish` and `send` send an event; every part is optional."""

    # Default: where the payload says it belongs (`data.subject()`).
    subject: str | None
    correlation_id: str | None
    causation: Envelope | None
    event_id: str | None
    # A W3C traceparent: the publish becomes part of that trace (the job's, say) when it is
    # not caused by one of the job's events; `links` names related traces.
    trace_parent: str | None
    links: Sequence[str | None]
    # Published again until stored while the publisher runs (module doc).
    persist: bool


class EventPublisher:
    def __init__(
        self,
        bus: Bus,
        source: str,
        *,
        tracer: Tracer | None = None,
        running: Callable[[], bool] | None = None,
    ) -> None:
        self._bus = bus
        self._source = source
        self._tracer = tracer or default_tracer()
        # While it says so, a `persist` publish is made again until stored (module doc);
        # without it, never: a tool's publish fails for its user to see.
        self._running = running

    @property
    def source(self) -> str:
        return self._source

    async def publish(
        self, data: EventData, *, traced: bool = True, **how: Unpack[Sending]
    ) -> Envelope:
        """Wrap `data` in an envelope from this source and publish it; returns the envelope.

        `how` says where and in which trace (`Sending`). Untraced (`traced` False), it goes
        out without a span of its own: for reports so frequent that a span each would
        outweigh them and bury a trace's decisions.
        """
        envelope = self._wrap(data, how)
        await self._deliver(envelope, how, traced=traced)
        return envelope

    def send(self, data: EventData, **how: Unpack[Sending]) -> asyncio.Task[PubAck]:
        """`publish` without waiting: the task ends when the event is stored (or failed).

        Whoever depends on the event being stored (acknowledging its cause, writing a record
        that says it went out) awaits the task first.
        """
        envelope = self._wrap(data, how)
        return asyncio.get_running_loop().create_task(self._deliver(envelope, how, traced=True))

    def _wrap(self, data: EventData, how: Sending) -> Envelope:
        return Envelope.wrap(
            data,
            subject=how.get("subject"),
            source=self._source,
            correlation_id=how.get("correlation_id"),
            causation=how.get("causation"),
            event_id=how.get("event_id"),
        )

    def _deliver(
        self, envelope: Envelope, how: Sending, *, traced: bool
    ) -> Coroutine[Any, Any, PubAck]:
        return self.publish_envelope(
            envelope,
            trace_parent=how.get("trace_parent"),
            links=how.get("links", ()),
            traced=traced,
            persist=how.get("persist", False),
        )

    async def publish_envelope(
        self,
        envelope: Envelope,
        *,
        trace_parent: str | None = None,
        links: Sequence[str | None] = (),
        traced: bool = True,
        persist: bool = False,
    ) -> PubAck:
        while True:
            try:
                return await self._publish_once(envelope, trace_parent, links, traced)
            except PublishFailed as exc:
                if not persist or self._running is None or not self._running():
                    raise
                _log.warning(
                    "event not stored yet: publishing it again",
                    event_type=envelope.type,
                    subject=envelope.subject,
                    error=repr(exc),
                )
                await asyncio.sleep(AGAIN_AFTER_S)

    async def _publish_once(
        self,
        envelope: Envelope,
        trace_parent: str | None,
        links: Sequence[str | None],
        traced: bool,
    ) -> PubAck:
        payload, headers = encode(envelope)
        if not traced:
            # No span of its own, but its readers still join the trace it goes out in (a
            # progress report: its run's), if any: what they publish of it lands there.
            inject_context(headers, join_trace(trace_parent)[0])
            return await self._bus.publish(
                envelope.subject, payload, headers=headers, msg_id=envelope.id
            )
        with publish_span(
            self._tracer,
            envelope.subject,
            envelope,
            len(payload),
            trace_parent=trace_parent,
            links=links,
        ) as span:
            inject_context(headers, propagated_context(span))
            ack = await self._bus.publish(
                envelope.subject, payload, headers=headers, msg_id=envelope.id
            )
            span.set_attribute("gfair.stream", ack.stream)
            span.set_attribute("gfair.stream.sequence", ack.sequence)
            span.set_attribute("gfair.duplicate", ack.duplicate)
        return ack
