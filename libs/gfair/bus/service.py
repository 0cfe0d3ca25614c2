"""A service is a table of handlers (and timers) and nothing more.

    service = Service("placement")

    @service.handler()  # consumer derived: GFAIR_JOBS, filter gfair.submit.*
    async def on_submit(envelope: Envelope, data: JobSubmitted) -> list[Emit]:
        return [Emit(JobAccepted(...))]

    @service.handler(ConsumerSpec(stream="GFAIR_NODES", durable="placement-nodes",
                                  filter_subjects=("gfair.node.*.failed",), max_attempts=10))
    async def on_node_failed(envelope: Envelope, data: NodeFailed) -> list[Emit]: ...

A handler gets the envelope and its typed payload and returns the events to publish; the
runtime publishes them (with causation and correlation set) before it acknowledges the input,
so a crash in between republishes them under the same ids and JetStream keeps one copy.
Handlers must therefore be idempotent by event id and their outputs deterministic.

The runtime handles the events of one fetch in order, then settles them together: the route's
`settle` hook (where a handler's deferred writes are completed), then every output of the batch
published in order without waiting for each store acknowledgement in turn, then the inputs
acknowledged at once. A service that keeps its state in a bucket can so write it once per batch
instead of once per event.

A route with `lanes` is handled concurrently instead: each delivery names its lanes (a job,
the GPUs it touches), waits for the earlier deliveries sharing one with it, runs beside the
others, and is settled (its outputs published, then acknowledged) on its own as soon as it is
handled, while the runtime fetches what comes next.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Awaitable, Callable, Collection, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, Unpack

from gfair.bus.topology import ConsumerSpec, Topology, consumer_for
from gfair.events.envelope import Envelope, EventData

if TYPE_CHECKING:
    from gfair.bus.runtime import ServiceRuntime


@dataclass(frozen=True, slots=True)
class Emit:
    """An event a handler or timer wants published."""

    data: EventData
    # Default: where the payload says it belongs (`data.subject()`).
    subject: str | None = None
    # Default: derived from the causing event's id and the output's position, so a replayed
    # handler emits the same ids and JetStream dedup drops the repeats.
    event_id: str | None = None
    # Default: the causing event's correlation id (or its id when it has none).
    correlation_id: str | None = None
    # The W3C traceparent of the trace this event belongs to (a job's, kept by the service
    # from `current_traceparent()`); default: the trace of whatever is running (the handled
    # event's, or a new one for a timer). See `gfair.bus.tracing.join_trace`.
    trace_parent: str | None = None
    # Traceparents of other traces to link the publish to (the jobs a per-server decision
    # is about, say).
    links: tuple[str, ...] = ()
    # False: published without a span of its own (in `trace_parent`'s trace, if given). For
    # periodic reports (a heartbeat of every node every few seconds), where a span each would
    # cost more than the report and bury the traces that say something.
    traced: bool = True


class Unprocessable(Exception):
    """Raised by a handler for an event that can never succeed: dead-letter it, don't retry."""


@dataclass(frozen=True, slots=True)
class InvalidInput:
    """A message a route refused before its handler ran: not an envelope, or not a valid event.

    What a route's `on_invalid` hook gets to answer the sender with (see `Route.on_invalid`).
    """

    subject: str
    payload: bytes
    # The envelope when the body is one (its payload or subject is what is wrong); None when
    # the body is not an envelope at all.
    envelope: Envelope | None
    # What is wrong, naming the field path (as in the dead letter).
    reason: str


EventHandler = Callable[[Envelope, Any], Awaitable[Sequence[Emit]]]
# Pure: it may only say what to answer; the runtime publishes the answer, then dead-letters
# the input as usual, so an invalid input changes no state anywhere.
InvalidHandler = Callable[[InvalidInput], Sequence[Emit]]
TimerCallback = Callable[[], Awaitable[Sequence[Emit]]]
# Completes what the handlers of a batch deferred; raising retries the whole batch.
SettleHook = Callable[[], Awaitable[None]]
# Sees the valid events of a batch before their handlers do, to fetch what they will read.
PrepareHook = Callable[[Sequence[tuple[Envelope, Any]]], Awaitable[None]]
# The lanes of an event (`Route.lanes`); None: it runs alone, after every earlier delivery and
# before every later one.
LanesHook = Callable[[Envelope, Any], Collection[Hashable] | None]
StartupHook = Callable[["ServiceRuntime"], Awaitable[None]]
H = TypeVar("H", bound=EventHandler)
T = TypeVar("T", bound=TimerCallback)
S = TypeVar("S", bound=StartupHook)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before redelivering a failed event: initial * factor^(attempt-1), capped."""

    initial_s: float = 0.2
    factor: float = 2.0
    max_s: float = 30.0

    def delay(self, attempt: int) -> float:
        return min(self.initial_s * self.factor ** max(attempt - 1, 0), self.max_s)


@dataclass(frozen=True, slots=True)
class Route:
    name: str
    consumer: ConsumerSpec
    handler: EventHandler
    # Payload models this handler takes; other event types on its consumer are acknowledged
    # and skipped. Empty: every registered type.
    accepts: tuple[type[EventData], ...] = ()
    # Concurrent fetch-and-handle loops on the consumer in this process.
    workers: int = 1
    backoff: Backoff = field(default_factory=Backoff)
    # Answers an input refused as undecodable or invalid (a rejection event to the sender of a
    # bad submission, say) before it is dead-lettered. None: the dead letter is the only answer.
    on_invalid: InvalidHandler | None = None
    # Awaited after the handlers of a batch ran, before their outputs are published and their
    # inputs acknowledged: the writes handlers deferred (a record written once per batch rather
    # than once per event) must be done when it returns. Raising hands every input of the
    # batch back for redelivery, so the handlers must then find their state as it was stored.
    settle: SettleHook | None = None
    # Awaited with the batch's decodable events of accepted types, in order, before the first
    # handler runs: the place to read in one go what the handlers would read one by one. An
    # optimisation only: if it fails the handlers run all the same.
    prepare: PrepareHook | None = None
    # Handled concurrently, each delivery after the earlier ones that share a lane with it and
    # settled alone (see the module doc); called in delivery order, before its handler runs.
    # Not with `settle` or `prepare` (there is no batch) nor with more than one worker (the
    # lanes are one process's).
    lanes: LanesHook | None = None
    # Event types handled without a consumer span of their own: frequent reports of which a
    # handler decides nothing nearly every time (a job's progress, every second). What such
    # an event causes is still published in its producer's trace; a failure is logged and
    # retried or dead-lettered as ever.
    untraced: tuple[type[EventData], ...] = ()

    @property
    def accepted_types(self) -> frozenset[str]:
        return frozenset(model.EVENT_TYPE for model in self.accepts)

    @property
    def untraced_types(self) -> frozenset[str]:
        return frozenset(model.EVENT_TYPE for model in self.untraced)


@dataclass(frozen=True, slots=True)
class Timer:
    name: str
    interval_s: float
    callback: TimerCallback
    # Seconds from the start to the first call (asked once the startup hooks ran); None:
    # one interval. A timer can so keep a grid its service kept before a restart.
    first_in: Callable[[], float] | None = None


def accepted_models(handler: EventHandler) -> tuple[type[EventData], ...]:
    """The payload models named by the annotation of a handler's second parameter."""
    try:
        hints = typing.get_type_hints(handler)
    except NameError as exc:
        raise TypeError(
            f"cannot resolve the annotations of handler {handler.__qualname__} ({exc}); "
            "pass accepts=... explicitly"
        ) from exc
    params = list(inspect.signature(handler).parameters)
    if len(params) != 2:
        raise TypeError(f"handler {handler.__qualname__} must take (envelope, data)")
    hint = hints.get(params[1], EventData)
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    options = typing.get_args(hint) if union else (hint,)
    models: list[type[EventData]] = []
    for option in options:
        if not (isinstance(option, type) and issubclass(option, EventData)):
            raise TypeError(
                f"handler {handler.__qualname__}: data annotation {hint!r} is not an EventData"
            )
        if option is EventData:
            return ()
        models.append(option)
    return tuple(models)


class RouteOptions(TypedDict, total=False):
    """How `Service.add_handler` routes a consumer's events; every part is optional."""

    # The derived consumer's durable name (default `<service>-<handler>`).
    durable: str | None
    # Payload models taken (default: the handler's annotation).
    accepts: Sequence[type[EventData]] | None
    workers: int
    backoff: Backoff | None
    # The route's name (default: the handler's).
    name: str | None
    on_invalid: InvalidHandler | None
    # The consumer's ack wait (how soon a crashed process's unacknowledged events go to
    # another one), whether the consumer is derived or given.
    ack_wait_s: float | None
    settle: SettleHook | None
    prepare: PrepareHook | None
    lanes: LanesHook | None
    untraced: Sequence[type[EventData]]


class Service:
    def __init__(self, name: str, *, topology: Topology | None = None) -> None:
        self.name = name
        self._topology = topology or Topology()
        self._routes: list[Route] = []
        self._timers: list[Timer] = []
        self._startup: list[StartupHook] = []

    @property
    def routes(self) -> tuple[Route, ...]:
        return tuple(self._routes)

    @property
    def timers(self) -> tuple[Timer, ...]:
        return tuple(self._timers)

    @property
    def startup_hooks(self) -> tuple[StartupHook, ...]:
        return tuple(self._startup)

    @property
    def topology(self) -> Topology:
        """The declared topology plus every route's consumer."""
        return self._topology.merge(Topology(consumers=tuple(r.consumer for r in self._routes)))

    def add_handler(
        self,
        handler: EventHandler,
        consumer: ConsumerSpec | None = None,
        **options: Unpack[RouteOptions],
    ) -> Route:
        """Route a consumer's events to `handler`, as `options` say (`RouteOptions`).

        Without `consumer`, one is derived from the payload models the handler takes (its
        annotation, or `accepts`): their stream, their subject patterns as filters, and the
        durable name `durable` (default `<service>-<handler>`).
        """
        workers = options.get("workers", 1)
        settle, prepare, lanes = options.get("settle"), options.get("prepare"), options.get("lanes")
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if lanes is not None and (settle is not None or prepare is not None or workers > 1):
            raise ValueError("a route with lanes has no batch to settle or prepare, one worker")
        name = options.get("name") or handler.__name__
        accepts, durable = options.get("accepts"), options.get("durable")
        models = tuple(accepts) if accepts is not None else accepted_models(handler)
        if consumer is None:
            if durable is None:
                durable = f"{self.name}-{name}".replace("_", "-")
            consumer = consumer_for(models, durable=durable)
        elif durable is not None and durable != consumer.durable:
            raise ValueError(f"durable {durable!r} contradicts consumer {consumer.durable!r}")
        if (ack_wait_s := options.get("ack_wait_s")) is not None:
            consumer = replace(consumer, ack_wait_s=ack_wait_s)
        route = Route(
            name=name,
            consumer=consumer,
            handler=handler,
            accepts=models,
            workers=workers,
            backoff=options.get("backoff") or Backoff(),
            on_invalid=options.get("on_invalid"),
            settle=settle,
            prepare=prepare,
            lanes=lanes,
            untraced=tuple(options.get("untraced", ())),
        )
        if any(
            r.consumer.durable == consumer.durable and r.consumer.stream == consumer.stream
            for r in self._routes
        ):
            raise ValueError(f"durable {consumer.durable} already has a handler in {self.name}")
        self._routes.append(route)
        return route

    def handler(
        self, consumer: ConsumerSpec | None = None, **options: Unpack[RouteOptions]
    ) -> Callable[[H], H]:
        """Decorator form of `add_handler`."""

        def register(handler: H) -> H:
            self.add_handler(handler, consumer, **options)
            return handler

        return register

    def add_timer(
        self,
        interval_s: float,
        callback: TimerCallback,
        *,
        name: str | None = None,
        first_in: Callable[[], float] | None = None,
    ) -> Timer:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        timer = Timer(
            name=name or callback.__name__,
            interval_s=interval_s,
            callback=callback,
            first_in=first_in,
        )
        self._timers.append(timer)
        return timer

    def timer(self, interval_s: float) -> Callable[[T], T]:
        """Call the decorated coroutine every `interval_s` and publish what it returns."""

        def register(callback: T) -> T:
            self.add_timer(interval_s, callback)
            return callback

        return register

    def on_start(self, hook: S) -> S:
        """Decorator: run `hook(runtime)` once the topology exists and before any handler runs.

        The place to rebuild state from buckets and stream history (docs/design.md §3.3).
        """
        self._startup.append(hook)
        return hook
