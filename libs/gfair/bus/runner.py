"""The handler runner: fetch, decode, handle, publish the outputs, then acknowledge.

The deliveries of one fetch are handled one after another, in order, and then settled together:
the route's `settle` hook, then all their outputs published in order and awaited together, then
the inputs acknowledged at once. Per event that saves a round trip for each output and a write
for each acknowledgement, and lets a service store its state once per batch. A batch is
settled early when it has been held for a quarter of the ack wait, so nothing is redelivered
while it waits. A route with lanes (`Route.lanes`) is handled concurrently instead, each delivery
after the earlier ones it shares a lane with, and settled alone (`_run_in_lanes`).
Each delivery is handled in a consumer span of its own, except those of a route's untraced
types (`Route.untraced`: a job's progress, every second), whose outputs join their producer's
trace directly.

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
import contextvars
import functools
import time
from collections.abc import Callable, Collection, Coroutine, Hashable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

import structlog
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from gfair.bus.dead_letter import DeadLetter, DeadLetterReason, publish_dead_letter
from gfair.bus.metrics import export_from_zero, gfair_metrics
from gfair.bus.publisher import EventPublisher, derived_event_id
from gfair.bus.service import Emit, InvalidInput, Route, Unprocessable
from gfair.bus.subject_filter import covers
from gfair.bus.tracing import TRACEPARENT, annotate_event, process_span
from gfair.bus.transport import Bus, BusError, Delivery, PubAck, PullConsumer
from gfair.bus.wire import EVENT_TYPE_HEADER, server_timed, validated_data
from gfair.events.codec import parse_envelope
from gfair.events.envelope import Envelope, EventData
from gfair.events.errors import InvalidEvent
from gfair.events.registry import UnknownEventType, model_for

_log = structlog.get_logger("gfair.bus.runner")


class DeliveryOutcome(StrEnum):
    HANDLED = "handled"
    SKIPPED = "skipped"
    RETRIED = "retried"
    DEAD_LETTERED = "dead_lettered"


# Deliveries fetched, handled and settled together at most: enough to spread a round trip and a
# bucket write over many events under load; a lone event is handled as soon as it arrives.
DEFAULT_BATCH = 64


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    batch: int = DEFAULT_BATCH
    # An idle fetch returns after this long; it bounds how fast a stop request is noticed.
    fetch_timeout_s: float = 1.0
    # Pause after an unexpected fetch error, so a broken connection does not spin.
    error_pause_s: float = 0.5


_Decoded = tuple[Envelope, EventData]


@dataclass(slots=True)
class _Handled:
    """A delivery its handler is done with, waiting for the batch to settle."""

    delivery: Delivery
    # Its outputs, each with the envelope it goes out in.
    outputs: list[tuple[Emit, Envelope]]
    # The context of its processing span, so that its outputs' publish spans are children.
    context: contextvars.Context
    # An untraced delivery's producer's traceparent: its outputs join that trace instead.
    trace_parent: str | None = None


@dataclass(slots=True)
class _Batch:
    handled: list[_Handled] = field(default_factory=list)
    # Settled without publishing anything: skipped events of other types.
    skipped: list[Delivery] = field(default_factory=list)
    began: float | None = None

    def hold(self) -> None:
        if self.began is None:
            self.began = time.monotonic()

    def held_s(self) -> float:
        return 0.0 if self.began is None else time.monotonic() - self.began

    def __bool__(self) -> bool:
        return bool(self.handled or self.skipped)


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
        task.add_done_callback(self._sent)
        self._handle = self._loop.call_later(self._interval_s, self._fire)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        # A signal that did not go out (a broken connection) is only a redelivery risked:
        # the handler's outcome decides the message, so it is logged, not raised.
        if not task.cancelled() and task.exception() is not None:
            _log.warning("in-progress signal failed", error=repr(task.exception()))

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
        self._untraced = route.untraced_types
        self._log = structlog.get_logger("gfair.bus.runner").bind(
            service=self._service, consumer=route.consumer.durable, handler=route.name
        )

    async def run(self, stopping: asyncio.Event) -> None:
        """Fetch and handle until `stopping` is set; the deliveries handled are always settled."""
        stream = self._route.consumer.stream
        export_from_zero(
            gfair_metrics().dead_letters,
            (
                {"service": self._service, "stream": stream, "reason": r.value}
                for r in DeadLetterReason
            ),
        )
        consumer = await self._bus.consume(self._route.consumer)
        # One waiter for the whole run, which each fetch races (not one more task per fetch).
        stopped = asyncio.ensure_future(stopping.wait())
        if self._route.lanes is not None:
            try:
                await self._run_in_lanes(consumer, stopping, stopped)
            finally:
                stopped.cancel()
                await consumer.close()
            return
        # Held this long, a batch is settled before the server would think it lost.
        hold_s = self._route.consumer.ack_wait_s / 4
        try:
            while not stopping.is_set():
                deliveries = await self._fetch(consumer, stopped)
                decoded = await self._prepare(deliveries)
                batch = _Batch()
                for index, delivery in enumerate(deliveries):
                    if stopping.is_set():
                        await self._hand_back(deliveries[index:])
                        break
                    await self.handle(delivery, batch, decoded[index])
                    if batch.held_s() > hold_s:
                        await self._settle(batch)
                        batch = _Batch()
                await self._settle(batch)
        finally:
            stopped.cancel()
            await consumer.close()

    async def _run_in_lanes(
        self,
        consumer: PullConsumer,
        stopping: asyncio.Event,
        stopped: asyncio.Future[Literal[True]],
    ) -> None:
        """Fetch while up to `batch` deliveries are handled, each in its lanes (`_Lanes`) and
        settled alone."""
        lanes = _Lanes()
        try:
            while not stopping.is_set():
                lanes.check()
                room = self._settings.batch - len(lanes.running)
                if room <= 0:
                    await asyncio.wait(lanes.running, return_when=asyncio.FIRST_COMPLETED)
                    continue
                for delivery in await self._fetch(consumer, stopped, room):
                    decoded = self._decode(delivery)
                    lanes.start(
                        self._lanes_of(decoded),
                        functools.partial(self._handle_in_lane, delivery, decoded, stopping),
                    )
        finally:
            if lanes.running:
                await asyncio.gather(*lanes.running, return_exceptions=True)

    def _lanes_of(self, decoded: _Decoded | None) -> Collection[Hashable] | None:
        """A delivery's lanes; None (alone) for one that does not decode or whose lanes fail."""
        if decoded is None or self._route.lanes is None:
            return None
        try:
            return self._route.lanes(*decoded)
        except Exception as exc:
            self._log.error("lanes failed; handled alone", error=repr(exc))
            return None

    async def _handle_in_lane(
        self,
        delivery: Delivery,
        decoded: _Decoded | None,
        stopping: asyncio.Event,
        waits: list[asyncio.Task[None]],
    ) -> None:
        if waits:
            # Its turn may be a while coming (a suspend waits out a job's yield).
            keep_alive = _KeepAlive(delivery, self._route.consumer.ack_wait_s / 2)
            try:
                await asyncio.wait(waits)
            finally:
                keep_alive.cancel()
        if stopping.is_set():
            await self._hand_back([delivery])
            return
        batch = _Batch()
        await self.handle(delivery, batch, decoded)
        await self._settle(batch)

    async def _fetch(
        self,
        consumer: PullConsumer,
        stopped: asyncio.Future[Literal[True]],
        most: int | None = None,
    ) -> list[Delivery]:
        """What the consumer has, waiting up to the fetch timeout for one; nothing once
        `stopped` is done, so that a long wait (a node's, for commands) does not hold a stop."""
        fetching = asyncio.ensure_future(
            consumer.fetch(most or self._settings.batch, self._settings.fetch_timeout_s)
        )
        try:
            await asyncio.wait((fetching, stopped), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not fetching.done():
                # What it would have brought stays unacknowledged and is delivered again.
                fetching.cancel()
                await asyncio.gather(fetching, return_exceptions=True)
        if fetching.cancelled():
            return []
        try:
            return fetching.result()
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

    async def _prepare(self, deliveries: Sequence[Delivery]) -> list[_Decoded | None]:
        """With a `prepare` hook, decode the batch ahead and show the hook its valid events."""
        if self._route.prepare is None or not deliveries:
            return [None] * len(deliveries)
        decoded = [self._decode(delivery) for delivery in deliveries]
        try:
            await self._route.prepare([item for item in decoded if item is not None])
        except Exception as exc:
            self._log.warning("prepare failed; handling without", error=repr(exc))
        return decoded

    def _decode(self, delivery: Delivery) -> _Decoded | None:
        """The event a delivery holds if it will reach the handler; None if in any doubt."""
        try:
            envelope = _envelope_of(delivery)
            if self._accepted and envelope.type not in self._accepted:
                return None
            return envelope, validated_data(envelope, delivery.subject)
        except InvalidEvent:
            return None

    async def handle(
        self, delivery: Delivery, batch: _Batch, decoded: _Decoded | None = None
    ) -> DeliveryOutcome:
        """Handle one delivery; a handled or skipped one joins `batch` to be settled with it.

        `decoded`: its event, decoded ahead (`_prepare`); else it is decoded here.
        """
        if self._untraced and delivery.headers.get(EVENT_TYPE_HEADER) in self._untraced:
            # The type header only picks the path: the body, decoded, must say the same.
            decoded = decoded or self._decode(delivery)
            if (
                decoded is not None
                and decoded[0].type in self._untraced
                and delivery.num_delivered <= self._route.consumer.max_attempts
            ):
                return await self._handle_valid(delivery, None, batch, *decoded)
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
            outcome = await self._handle(delivery, span, batch, decoded)
            span.set_attribute("gfair.outcome", outcome.value)
            return outcome

    async def _handle(
        self, delivery: Delivery, span: Span, batch: _Batch, decoded: _Decoded | None
    ) -> DeliveryOutcome:
        limit = self._route.consumer.max_attempts
        if delivery.num_delivered > limit:
            return await self._dead_letter(
                delivery,
                span,
                DeadLetterReason.DELIVERY_LIMIT,
                f"delivered {delivery.num_delivered} times, limit {limit}: "
                "earlier attempts never settled (handler crash or hang?)",
            )
        if decoded is not None:
            envelope, data = decoded
            annotate_event(span, envelope)
            return await self._handle_valid(delivery, span, batch, envelope, data)
        try:
            envelope = _envelope_of(delivery)
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
            batch.skipped.append(delivery)
            return DeliveryOutcome.SKIPPED
        try:
            data = validated_data(envelope, delivery.subject)
        except InvalidEvent as exc:
            return await self._refuse(
                delivery, span, DeadLetterReason.INVALID, exc.reason, envelope=envelope
            )
        return await self._handle_valid(delivery, span, batch, envelope, data)

    async def _handle_valid(
        self,
        delivery: Delivery,
        span: Span | None,
        batch: _Batch,
        envelope: Envelope,
        data: EventData,
    ) -> DeliveryOutcome:
        """`span` is None for an untraced delivery (`Route.untraced`)."""
        try:
            outputs = await self._call(envelope, data, delivery)
        except Unprocessable as exc:
            return await self._dead_letter(delivery, span, DeadLetterReason.REJECTED, str(exc))
        except Exception as exc:
            if span is not None:
                span.record_exception(exc)
            return await self._retry(delivery, span, DeadLetterReason.HANDLER_FAILED, exc)
        try:
            envelopes = outputs_to_envelopes(envelope, outputs, self._service)
        except Exception as exc:
            if span is not None:
                span.record_exception(exc)
            return await self._retry(delivery, span, DeadLetterReason.PUBLISH_FAILED, exc)
        batch.hold()
        batch.handled.append(
            _Handled(
                delivery,
                list(zip(outputs, envelopes, strict=True)),
                contextvars.copy_context(),
                delivery.headers.get(TRACEPARENT) if span is None and outputs else None,
            )
        )
        self._log.debug("handled", event_id=envelope.id, event_type=envelope.type)
        return DeliveryOutcome.HANDLED

    async def _settle(self, batch: _Batch) -> None:
        """The batch's deferred writes, then its outputs stored, then its inputs acknowledged."""
        if not batch:
            return
        handled = batch.handled
        if handled and self._route.settle is not None:
            try:
                await self._route.settle()
            except Exception as exc:
                for item in handled:
                    await self._retry(item.delivery, None, DeadLetterReason.HANDLER_FAILED, exc)
                handled = []
        # Every output of the batch leaves now, in order; then all are awaited together.
        sends = [self._send_outputs(item) for item in handled]
        results = await asyncio.gather(
            *(t for tasks in sends for t in tasks), return_exceptions=True
        )
        done: list[Delivery] = list(batch.skipped)
        position = 0
        for item, tasks in zip(handled, sends, strict=True):
            mine = results[position : position + len(tasks)]
            position += len(tasks)
            failure = next((r for r in mine if isinstance(r, BaseException)), None)
            if failure is None:
                done.append(item.delivery)
            elif isinstance(failure, Exception):
                await self._retry(item.delivery, None, DeadLetterReason.PUBLISH_FAILED, failure)
            else:
                raise failure
        # Nothing yields between them: the acknowledgements leave in one write.
        for delivery in done:
            await delivery.ack()

    def _send_outputs(self, item: _Handled) -> list[asyncio.Task[PubAck]]:
        loop = asyncio.get_running_loop()
        return [
            loop.create_task(
                self._publisher.publish_envelope(
                    output,
                    trace_parent=emit.trace_parent or item.trace_parent,
                    links=emit.links,
                    traced=emit.traced,
                ),
                context=item.context.copy(),
            )
            for emit, output in item.outputs
        ]

    async def _call(
        self, envelope: Envelope, data: EventData, delivery: Delivery
    ) -> Sequence[Emit]:
        keep_alive = _KeepAlive(delivery, self._route.consumer.ack_wait_s / 2)
        began = time.perf_counter()
        try:
            outputs = await self._route.handler(envelope, data)
        finally:
            keep_alive.cancel()
            gfair_metrics().handler_duration.record(
                time.perf_counter() - began,
                {"service": self._service, "handler": self._route.name},
            )
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
    ) -> DeliveryOutcome:
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
        self, delivery: Delivery, span: Span | None, reason: DeadLetterReason, exc: Exception
    ) -> DeliveryOutcome:
        """`span` is None when the delivery's processing span has ended (failed settling), or
        it has none (`Route.untraced`)."""
        error = f"{type(exc).__name__}: {exc}"
        if delivery.num_delivered >= self._route.consumer.max_attempts:
            return await self._dead_letter(delivery, span, reason, error)
        delay = self._route.backoff.delay(delivery.num_delivered)
        if span is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        self._log.warning(
            "handler failed, will retry",
            reason=reason.value,
            error=error,
            attempt=delivery.num_delivered,
            retry_in_s=delay,
        )
        await delivery.nak(delay)
        return DeliveryOutcome.RETRIED

    async def _dead_letter(
        self, delivery: Delivery, span: Span | None, reason: DeadLetterReason, error: str
    ) -> DeliveryOutcome:
        if span is not None:
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
            return DeliveryOutcome.RETRIED
        gfair_metrics().dead_letters.add(
            1, {"service": self._service, "stream": delivery.stream, "reason": reason.value}
        )
        self._log.error(
            "dead-lettered",
            reason=reason.value,
            error=error,
            subject=delivery.subject,
            sequence=delivery.stream_sequence,
            attempt=delivery.num_delivered,
        )
        await delivery.ack()
        return DeliveryOutcome.DEAD_LETTERED


class _Lanes:
    """Which deliveries each one waits for: the earlier ones sharing a lane with it; one with no
    lanes (None) waits for every earlier one, and every later one waits for it. The runner
    starts each delivery's task through `start` in delivery order (`HandlerRunner._run_in_lanes`).

    A node's commands so run at once where they touch other jobs and other GPUs: a quantum's
    suspends on one server together, then each start once the suspends of its GPUs are done,
    instead of one after another, each waiting on round trips to the broker."""

    def __init__(self) -> None:
        self._tails: dict[Hashable, asyncio.Task[None]] = {}
        self._barrier: asyncio.Task[None] | None = None
        self.running: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None

    def start(
        self,
        lanes: Collection[Hashable] | None,
        work: Callable[[list[asyncio.Task[None]]], Coroutine[object, object, None]],
    ) -> None:
        """Run `work(waits)` in a task, `waits` being the tasks it must wait for."""
        if lanes is None:
            after = set(self.running)
        else:
            after = {self._tails[k] for k in lanes if k in self._tails}
            if self._barrier is not None:
                after.add(self._barrier)
        task = asyncio.get_running_loop().create_task(work([t for t in after if not t.done()]))
        if lanes is None:
            self._barrier = task
        else:
            self._tails.update(dict.fromkeys(lanes, task))
        self.running.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure = task.exception()

    def check(self) -> None:
        """Raise what a task failed with (a broken connection), and let go of finished tails."""
        if self._failure is not None:
            raise self._failure
        self._tails = {k: t for k, t in self._tails.items() if not t.done()}


def _envelope_of(delivery: Delivery) -> Envelope:
    return server_timed(parse_envelope(delivery.data), delivery.subject, delivery.stored_at)
