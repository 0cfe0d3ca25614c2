"""The query service: tenants' questions about their own jobs, answered on request/reply.

It subscribes to ``gfair.query.*.*`` in the queue group `QUEUE_GROUP`, so any number of
replicas share the questions, and answers each from the services' records (`QueryResponder`).
It keeps no state and writes nothing: a restart loses at most the questions in flight, which
their askers time out on and ask again. Each answer is a span (``query <what>``) in the trace
of the asking tool when it sent a trace context.

A question about ``<user>`` is answered only on ``<user>``'s own inbox (``_INBOX_<user>.``), or
on the reply the server made for a question that came through a tenant's account import
(``_R_.``; the server maps the answer back into the asking tenant's own account): the reply
subject is chosen by the asker and the answer is published there with the service's rights, so
a question whose reply subject is anything else (``$JS.API.STREAM.PURGE.<stream>``, another
user's inbox, an event subject) is dropped with a warning. Questions wait in a queue
per tenant (`FairQueue`): tenants take turns for the service's slots, each within its own
concurrency and rate, and a tenant whose queue is full is told so at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

import structlog
from nats.aio.msg import Msg
from opentelemetry.trace import StatusCode, Tracer

from gfair.bus.metrics import export_from_zero, gfair_metrics
from gfair.bus.nats_bus import IMPORT_REPLY_PREFIX, NatsBus, inbox_prefix_for
from gfair.bus.observability import configure_observability
from gfair.bus.serve import BusSettings
from gfair.bus.tracing import extract_context
from gfair.client import GfairClient
from gfair.client.queries import ERROR_HEADER, QUERIES
from gfair.client.state_access import DirectAccess
from gfair.events.subjects import queries_pattern
from gfair_services.query.fair_queue import FairQueue, QueueFull
from gfair_services.query.responder import QueryResponder, Unanswerable
from gfair_services.query.settings import QuerySettings

SERVICE_NAME = "query"
QUEUE_GROUP = "gfair-query"
# Why a question went unanswered, as `gfair.queries.refused` labels it.
NOT_AN_INBOX, QUEUE_FULL = "reply_subject", "queue"
REFUSALS = (NOT_AN_INBOX, QUEUE_FULL)

_log = structlog.get_logger("gfair.services.query")


class QueryService:
    """Answers questions on `bus` until `stop`; `run` returns once the last one is answered."""

    def __init__(self, bus: NatsBus, settings: QuerySettings, tracer: Tracer) -> None:
        self._bus = bus
        access = DirectAccess(bus)
        self._responder = QueryResponder(access, GfairClient(bus, access=access))
        self._tracer = tracer
        self._queue: FairQueue[Msg] = FairQueue(settings.limits())
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = asyncio.Event()

    async def run(self) -> None:
        subscription = await self._bus.client.subscribe(
            queries_pattern(), queue=QUEUE_GROUP, cb=self._on_question
        )
        _log.info("answering queries", subjects=queries_pattern(), queue=QUEUE_GROUP)
        export_from_zero(
            gfair_metrics().queries_refused,
            ({"service": SERVICE_NAME, "reason": r} for r in REFUSALS),
        )
        dispatcher = asyncio.create_task(self._dispatch())
        try:
            await self._stopped.wait()
        finally:
            await subscription.unsubscribe()
            dispatcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await dispatcher
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)

    def stop(self) -> None:
        self._stopped.set()

    async def _on_question(self, msg: Msg) -> None:
        if not msg.reply:
            return  # a publish, not a request: nobody waits for an answer
        tenant = msg.subject.split(".")[2]  # gfair.query.<user>.<what>, as subscribed
        if not _on_inbox_of(tenant, msg.reply):
            _log.warning(
                "question dropped: its reply subject is not the asker's inbox",
                tenant=tenant,
                reply=msg.reply,
                subject=msg.subject,
            )
            gfair_metrics().queries_refused.add(
                1, {"service": SERVICE_NAME, "reason": NOT_AN_INBOX}
            )
            return
        try:
            self._queue.put(tenant, msg)
        except QueueFull as exc:
            gfair_metrics().queries_refused.add(1, {"service": SERVICE_NAME, "reason": QUEUE_FULL})
            await self._reply(msg, b"", {ERROR_HEADER: str(exc)})

    async def _dispatch(self) -> None:
        while True:
            tenant, msg = await self._queue.take()
            # Answered in a task of its own: one slow answer must not hold up the next.
            task = asyncio.create_task(self._answer(tenant, msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _answer(self, tenant: str, msg: Msg) -> None:
        asked = msg.subject.rsplit(".", 1)[-1]
        what = asked if asked in QUERIES else "unknown"  # a label per question, not per typo
        began = time.perf_counter()
        try:
            await self._answer_in_span(tenant, msg, what)
        finally:
            self._queue.done(tenant)
            gfair_metrics().handler_duration.record(
                time.perf_counter() - began, {"service": SERVICE_NAME, "handler": what}
            )

    async def _answer_in_span(self, tenant: str, msg: Msg, what: str) -> None:
        with self._tracer.start_as_current_span(
            f"query {what}", context=extract_context(msg.headers or {})
        ) as span:
            span.set_attribute("messaging.destination.name", msg.subject)
            span.set_attribute("gfair.query.waiting", self._queue.waiting(tenant))
            try:
                answer = await self._responder.answer(msg.subject, msg.data)
            except Unanswerable as exc:
                span.set_status(StatusCode.ERROR, str(exc))
                await self._reply(msg, b"", {ERROR_HEADER: str(exc)})
                return
            except Exception as exc:  # a bus failure: say so, keep answering others
                _log.exception("query failed", subject=msg.subject)
                span.record_exception(exc)
                span.set_status(StatusCode.ERROR, str(exc))
                await self._reply(msg, b"", {ERROR_HEADER: f"the query service failed: {exc}"})
                return
            await self._reply(msg, answer.model_dump_json().encode(), None)

    async def _reply(self, msg: Msg, data: bytes, headers: dict[str, str] | None) -> None:
        if not _on_inbox_of(msg.subject.split(".")[2], msg.reply):
            # Checked when the question came; checked again here, where the answer goes out.
            return
        try:
            await self._bus.client.publish(msg.reply, data, headers=headers)
        except Exception as exc:  # the asker is gone or the connection dropped: nothing to do
            _log.warning("cannot answer", subject=msg.subject, error=str(exc))


def _on_inbox_of(user: str, reply: str) -> bool:
    """Whether `reply` is a subject of `user`'s own inbox, ``_INBOX_<user>.<token>...``, or the
    server's mapping of a reply in the asker's own account, ``_R_.<token>...`` (only a tenant
    account's import leads a question here under `user`'s subject, `gfair.tenancy`)."""
    try:
        prefix = inbox_prefix_for(user)
    except ValueError:  # not a subject token: no inbox of anyone's
        return False
    head, dot, rest = reply.partition(".")
    tokens = rest.split(".")
    return (
        head in (prefix, IMPORT_REPLY_PREFIX)
        and bool(dot)
        and all(t and t not in ("*", ">") for t in tokens)
    )


async def serve(settings: QuerySettings, bus_settings: BusSettings | None = None) -> None:
    """Run the query service against NATS until SIGTERM/SIGINT."""
    bus_settings = bus_settings or BusSettings()
    observability = configure_observability(SERVICE_NAME)
    try:
        bus = await NatsBus.connect(bus_settings.nats_options(name=SERVICE_NAME))
        try:
            service = QueryService(bus, settings, observability.tracer)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, service.stop)
            await service.run()
        finally:
            await bus.close()
    finally:
        observability.shutdown()
