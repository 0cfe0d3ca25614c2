"""The handler runner: fetch, decode, handle, publish the outputs, then acknowledge.

Every delivery ends in exactly one of four ways:
- handled: the outputs are stored, then the input is acked (a crash in between republishes the
  outputs under the same ids, which JetStream drops as duplicates);
- skipped: an event type this handler does not take, acked;
- retried: the handler (or publishing its outputs) failed; nak with a growing delay;
- dead-lettered: poison (undecodable, invalid, rejected, or out of attempts) is parked on
  `gfair.dlq.<stream>` with the reason, then acked so the consumer moves on. An undecodable or
  invalid input is first answered through the route's `on_invalid` hook, when it has one (a
  submitter hears why its job was refused instead of waiting for an answer that never comes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import structlog
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from gfair.bus.dead_letter import DeadLetter, DeadLetterReason, publish_dead_letter
from gfair.bus.publisher import EventPublisher, derived_event_id
from gfair.bus.service import Emit, InvalidInput, Route, Unprocessable
from gfair.bus.subject_filter import covers
from gfair.bus.tracing import annotate_event, process_span
from gfair.bus.transport import Bus, BusError, Delivery, PullConsumer
from gfair.bus.wire import decode_envelope, validated_data
from gfair.events.envelope import Envelope, EventData
from gfair.events.errors import InvalidEvent
from gfair.events.registry import UnknownEventType, model_for


class Outcome(StrEnum):
    HANDLED = "handled"
    SKIPPED = "skipped"
    RETRIED = "retried"
    DEAD_LETTERED = "dead_lettered"


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    batch: int = 10
    # An idle fetch returns after this long; it bounds how fast a stop request is noticed.
    fetch_timeout_s: float = 1.0
    # Pause after an unexpected fetch error, so a broken connection does not spin.
    error_pause_s: float = 0.5


class _KeepAlive:
    """Tells the server a long handler is still working, so its message is not redelivered."""

    def __init__(self, delivery: Delivery, interval_s: float) -> None:
        self._delivery = delivery
        self._interval_s = interval_s
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_later(interval_s, self._fire)
        self._tasks: set[asyncio.Task[None]] = set()

    def _fire(self) -> None:
        task = self._loop.create_task(self._delivery.in_progress())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._handle = self._loop.call_later(self._interval_s, self._fire)

    def cancel(self) -> None:
        self._handle.cancel()


def outputs_to_envelopes(cause: Envelope, outputs: Sequence[Emit], source: str) -> list[Envelope]:
    """The envelopes a handler's outputs are published in: caused by, correlated with `cause`."""
    envelopes = []
    for index, emit in enumerate(outputs):
        subject = emit.subject or emit.data.subject()
        envelopes.append(
            Envelope.wrap(
                emit.data,
                subject=subject,
                source=source,
                causation=cause,
                correlation_id=emit.correlation_id or cause.correlation_id or cause.id,
                event_id=emit.event_id
                or derived_event_id(cause.id, index, emit.data.EVENT_TYPE, subject),
            )
        )
    return envelopes


def is_registered(event_type: str) -> bool:
    """Unknown types are not skipped but dead-lettered: they mean this process is out of date."""
    try:
        model_for(event_type)
    except UnknownEventType:
        return False
    return True


def belongs_on(event_type: str, subject: str) -> bool:
    """Whether events of a registered `event_type` are ever published on `subject`.

    A handler skips the other kinds of event on its subjects; an event on a subject its kind
    is never published on (a job report on a submission subject) is not another handler's
    business but an invalid input, and is refused like one.
    """
    try:
        pattern = model_for(event_type).subject_pattern()
    except NotImplementedError:
        return True  # a model that does not say where it is published cannot be checked
    return covers(pattern, subject)


def invalid_answer_id(stream: str, sequence: int, index: int, event_type: str, subject: str) -> str:
    """Id of the `index`-th answer to the refused input stored at `sequence` of `stream`.

    Derived from where the input is stored, since its own id may be missing or forged; the
    same on every redelivery, so a repeated answer is dropped as a duplicate.
    """
    return derived_event_id(f"{stream}/{sequence}", index, event_type, subject)


class HandlerRunner:
    def __init__(
        self,
        route: Route,
        bus: Bus,
        publisher: EventPublisher,
        *,
        tracer: Tracer,
        settings: RunnerSettings,
    ) -> None:
        self._route = route
        self._bus = bus
        self._publisher = publisher
        self._tracer = tracer
        self._settings = settings
        self._service = publisher.source
        self._accepted = route.accepted_types
        self._log = structlog.get_logger("gfair.bus.runner").bind(
            service=self._service, consumer=route.consumer.durable, handler=route.name
        )

    async def run(self, stopping: asyncio.Event) -> None:
        """Fetch and handle until `stopping` is set; the delivery in hand is always finished."""
        consumer = await self._bus.consume(self._route.consumer)
        try:
            while not stopping.is_set():
                deliveries = await self._fetch(consumer)
                for index, delivery in enumerate(deliveries):
                    if stopping.is_set():
                        await self._hand_back(deliveries[index:])
                        break
                    await self.handle(delivery)
        finally:
            await consumer.close()

    async def _fetch(self, consumer: PullConsumer) -> list[Delivery]:
        try:
            return await consumer.fetch(self._settings.batch, self._settings.fetch_timeout_s)
        except BusError:
            raise
        except Exception as exc:
            self._log.warning("fetch failed", error=repr(exc))
            await asyncio.sleep(self._settings.error_pause_s)
            return []

    async def _hand_back(self, deliveries: Sequence[Delivery]) -> None:
        # Not started: release them now instead of holding them until the ack wait expires.
        for delivery in deliveries:
            try:
                await delivery.nak()
            except Exception as exc:
                self._log.warning("nak on shutdown failed", error=repr(exc))

    async def handle(self, delivery: Delivery) -> Outcome:
        with process_span(
            self._tracer,
            subject=delivery.subject,
            headers=delivery.headers,
            consumer=self._route.consumer.durable,
            stream=delivery.stream,
            stream_sequence=delivery.stream_sequence,
            attempt=delivery.num_delivered,
            body_size=len(delivery.data),
        ) as span:
            outcome = await self._handle(delivery, span)
            span.set_attribute("gfair.outcome", outcome.value)
            return outcome

    async def _handle(self, delivery: Delivery, span: Span) -> Outcome:
        limit = self._route.consumer.max_attempts
        if delivery.num_delivered > limit:
            return await self._dead_letter(
                delivery,
                span,
                DeadLetterReason.DELIVERY_LIMIT,
                f"delivered {delivery.num_delivered} times, limit {limit}: "
                "earlier attempts never settled (handler crash or hang?)",
            )
        try:
            envelope = decode_envelope(delivery.data)
        except InvalidEvent as exc:
            return await self._refuse(
                delivery, span, DeadLetterReason.UNDECODABLE, exc.reason, envelope=None
            )
        annotate_event(span, envelope)
        if (
            self._accepted
            and envelope.type not in self._accepted
            and is_registered(envelope.type)
            and belongs_on(envelope.type, delivery.subject)
        ):
            # Another kind of event on the same subjects: someone else's business.
            await delivery.ack()
            return Outcome.SKIPPED
        try:
            data = validated_data(envelope, delivery.subject)
        except InvalidEvent as exc:
            return await self._refuse(
                delivery, span, DeadLetterReason.INVALID, exc.reason, envelope=envelope
            )
        try:
            outputs = await self._call(envelope, data, delivery)
        except Unprocessable as exc:
            return await self._dead_letter(delivery, span, DeadLetterReason.REJECTED, str(exc))
        except Exception as exc:
            span.record_exception(exc)
            return await self._retry(delivery, span, DeadLetterReason.HANDLER_FAILED, exc)
        try:
            envelopes = outputs_to_envelopes(envelope, outputs, self._service)
            for emit, output in zip(outputs, envelopes, strict=True):
                await self._publisher.publish_envelope(
                    output, trace_parent=emit.trace_parent, links=emit.links
                )
        except Exception as exc:
            span.record_exception(exc)
            return await self._retry(delivery, span, DeadLetterReason.PUBLISH_FAILED, exc)
        await delivery.ack()
        self._log.debug("handled", event_id=envelope.id, event_type=envelope.type)
        return Outcome.HANDLED

    async def _call(
        self, envelope: Envelope, data: EventData, delivery: Delivery
    ) -> Sequence[Emit]:
        keep_alive = _KeepAlive(delivery, self._route.consumer.ack_wait_s / 2)
        try:
            outputs = await self._route.handler(envelope, data)
        finally:
            keep_alive.cancel()
        if outputs is None:
            raise TypeError(f"handler {self._route.name} returned None; return [] for no events")
        return outputs

    async def _refuse(
        self,
        delivery: Delivery,
        span: Span,
        reason: DeadLetterReason,
        error: str,
        *,
        envelope: Envelope | None,
    ) -> Outcome:
        """An input that can never be handled: answer it if the route says how, dead-letter it.

        The answer goes first: a crash before the dead letter redelivers the input, which
        answers again under the same ids (dropped as duplicates) and is then parked.
        """
        try:
            for output in self._answers(delivery, envelope, error):
                await self._publisher.publish_envelope(output)
        except Exception as exc:
            span.record_exception(exc)
            return await self._retry(delivery, span, DeadLetterReason.PUBLISH_FAILED, exc)
        return await self._dead_letter(delivery, span, reason, error)

    def _answers(self, delivery: Delivery, envelope: Envelope | None, error: str) -> list[Envelope]:
        hook = self._route.on_invalid
        if hook is None:
            return []
        invalid = InvalidInput(
            subject=delivery.subject, payload=delivery.data, envelope=envelope, reason=error
        )
        try:
            outputs = hook(invalid)
        except Exception as exc:
            # The dead letter still records why; a broken hook must not keep poison around.
            self._log.error("on_invalid hook failed", error=repr(exc), subject=delivery.subject)
            return []
        answers = []
        for index, emit in enumerate(outputs):
            subject = emit.subject or emit.data.subject()
            correlation = emit.correlation_id or (
                (envelope.correlation_id or envelope.id) if envelope is not None else None
            )
            answers.append(
                Envelope.wrap(
                    emit.data,
                    subject=subject,
                    source=self._service,
                    causation=envelope,
                    correlation_id=correlation,
                    event_id=emit.event_id
                    or invalid_answer_id(
                        delivery.stream,
                        delivery.stream_sequence,
                        index,
                        emit.data.EVENT_TYPE,
                        subject,
                    ),
                )
            )
        return answers

    async def _retry(
        self, delivery: Delivery, span: Span, reason: DeadLetterReason, exc: Exception
    ) -> Outcome:
        error = f"{type(exc).__name__}: {exc}"
        if delivery.num_delivered >= self._route.consumer.max_attempts:
            return await self._dead_letter(delivery, span, reason, error)
        delay = self._route.backoff.delay(delivery.num_delivered)
        span.set_status(Status(StatusCode.ERROR, error))
        self._log.warning(
            "handler failed, will retry",
            reason=reason.value,
            error=error,
            attempt=delivery.num_delivered,
            retry_in_s=delay,
        )
        await delivery.nak(delay)
        return Outcome.RETRIED

    async def _dead_letter(
        self, delivery: Delivery, span: Span, reason: DeadLetterReason, error: str
    ) -> Outcome:
        span.set_status(Status(StatusCode.ERROR, f"{reason.value}: {error}"))
        span.set_attribute("gfair.dead_letter.reason", reason.value)
        record = DeadLetter.of(
            delivery,
            reason=reason,
            error=error,
            consumer=self._route.consumer.durable,
            service=self._service,
        )
        try:
            await publish_dead_letter(self._bus, record)
        except Exception as exc:
            # Never drop it: keep it on the consumer and try again later.
            self._log.error("dead-lettering failed", error=repr(exc), reason=reason.value)
            await delivery.nak(self._route.backoff.delay(delivery.num_delivered))
            return Outcome.RETRIED
        self._log.error(
            "dead-lettered",
            reason=reason.value,
            error=error,
            subject=delivery.subject,
            sequence=delivery.stream_sequence,
            attempt=delivery.num_delivered,
        )
        await delivery.ack()
        return Outcome.DEAD_LETTERED
