"""A tenant's reads: questions to the query service, and its jobs' events live.

A tenant's login may publish its own submissions and questions and subscribe to its own jobs'
events and its own inbox, nothing else (deploy/nats/README.md): no bucket, no stream, no
consumer. So every read is a request on ``gfair.query.<tenant>.<what>`` (`gfair.client.queries`),
and following a job waits on a live subscription to its events between reads instead of polling
the service.

The service answers a question about ``<user>`` only on ``<user>``'s own inbox,
``_INBOX_<user>.`` (a reply subject is where the answer is published, with the service's
rights; any other is dropped). `ask_query` asks with such a reply subject however the
connection was made: a tenant's connection has that inbox prefix already; the operator, whose
login may read any inbox, asks about itself or, as `gfair up`'s readiness probe does, as itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import TypeVar

import nats.errors
from nats.aio.client import NO_RESPONDERS_STATUS
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import Header
from nats.nuid import NUID
from pydantic import BaseModel, ValidationError

from gfair.bus.history import HistoricalEvent
from gfair.bus.job_output import OutputChunk
from gfair.bus.nats_bus import inbox_prefix_for
from gfair.bus.tracing import inject_context
from gfair.bus.wire import validated_data
from gfair.client.errors import ClientError, NoCluster
from gfair.client.explanation import Explanation
from gfair.client.queries import (
    ERROR_HEADER,
    EventsPage,
    EventsQuery,
    JobAnswer,
    JobQuery,
    JobsPage,
    JobsQuery,
    NodesAnswer,
    NoQuery,
    OutputPage,
    OutputQuery,
    SharesAnswer,
    StrideAnswer,
    WhyAnswer,
)
from gfair.events.errors import InvalidEvent
from gfair.events.subjects import JOBS_STREAM, job_events_pattern, query_subject
from gfair.state.job_record import JobRecord
from gfair.state.node_record import NodeRecord
from gfair.state.share_record import SharesRecord
from gfair.state.stride_record import StrideRecord

A = TypeVar("A", bound=BaseModel)

# A question unanswered this long: the service is down, or the login may not ask it.
REQUEST_TIMEOUT_S = 5.0
# Following a job reads again at least this often, in case a live event was missed (the
# subscription sees only what is published while it exists).
FALLBACK_POLL_S = 2.0


async def ask_query(
    nc: NatsClient,
    user: str,
    what: str,
    body: bytes,
    *,
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> Msg:
    """Ask `what` about `user`, with the answer coming to `user`'s own inbox.

    Raises nats-py's `TimeoutError` or `NoRespondersError` as `request` does.
    """
    subject = query_subject(user, what)
    prefix = f"{inbox_prefix_for(user)}."
    if nc.new_inbox().startswith(prefix):
        return await nc.request(subject, body, timeout=timeout_s, headers=headers)
    inbox = prefix + NUID().next().decode()
    subscription = await nc.subscribe(inbox, max_msgs=1)
    try:
        await nc.publish(subject, body, reply=inbox, headers=headers)
        reply = await subscription.next_msg(timeout=timeout_s)
        if reply.headers and reply.headers.get(Header.STATUS) == NO_RESPONDERS_STATUS:
            raise nats.errors.NoRespondersError
        return reply
    finally:
        with contextlib.suppress(nats.errors.Error):
            await subscription.unsubscribe()


class QueryRefused(ClientError):
    """The query service answered that it cannot answer (the message says why)."""


class QueryAccess:
    """`StateAccess` for `tenant`: it reads only its own jobs, through the query service."""

    def __init__(self, nc: NatsClient, tenant: str) -> None:
        self._nc = nc
        self.tenant = tenant
        self._live: dict[str, tuple[Subscription, asyncio.Event]] = {}

    async def job_records(self, user: str | None) -> list[JobRecord]:
        self._own(user)
        records: list[JobRecord] = []
        after: str | None = None
        while True:
            page = await self._ask("jobs", JobsQuery(after=after), JobsPage)
            records += page.records
            if page.next is None:
                return records
            after = page.next

    async def job_record(self, user: str, job_id: str) -> JobRecord | None:
        return (await self.job(user, job_id)).record

    async def job(self, user: str, job_id: str) -> JobAnswer:
        self._own(user)
        return await self._ask("job", JobQuery(job_id=job_id), JobAnswer)

    async def shares(self) -> SharesRecord | None:
        return (await self._ask("shares", NoQuery(), SharesAnswer)).record

    async def stride(self) -> StrideRecord | None:
        return (await self._ask("stride", NoQuery(), StrideAnswer)).record

    async def nodes(self) -> list[NodeRecord]:
        return list((await self._ask("nodes", NoQuery(), NodesAnswer)).records)

    async def node(self, node_id: str) -> NodeRecord | None:
        return next((n for n in await self.nodes() if n.node_id == node_id), None)

    async def events(
        self, user: str | None, job_id: str | None, start: int
    ) -> AsyncGenerator[HistoricalEvent, None]:
        self._own(user)
        next_start: int | None = start
        while next_start is not None:
            page = await self._ask(
                "events", EventsQuery(job_id=job_id, start=next_start), EventsPage
            )
            for stored in page.events:
                try:
                    data = validated_data(stored.envelope, stored.subject)
                except InvalidEvent:
                    continue  # as read_history does: the services dead-lettered it
                yield HistoricalEvent(JOBS_STREAM.name, stored.sequence, stored.envelope, data)
            next_start = page.next

    async def output(self, user: str, job_id: str, start: int) -> AsyncGenerator[OutputChunk, None]:
        self._own(user)
        next_start: int | None = start
        while next_start is not None:
            question = OutputQuery(job_id=job_id, start=next_start)
            page = await self._ask("output", question, OutputPage)
            for c in page.chunks:
                yield OutputChunk(c.output, c.node, c.run, c.offset, c.data, c.end, c.sequence)
            next_start = page.next

    async def cleared_trades(self, start: int) -> AsyncGenerator[int, None]:
        # None: the auction's events name every user; a tenant sees its own trades in `shares`.
        return
        yield start

    async def changed(self, user: str, job_id: str, timeout_s: float | None) -> None:
        self._own(user)
        pattern = job_events_pattern(self.tenant, job_id)
        live = self._live.get(pattern)
        if live is None:
            event = asyncio.Event()

            async def on_event(_: object) -> None:
                event.set()

            subscription = await self._nc.subscribe(pattern, cb=on_event)
            self._live[pattern] = (subscription, event)
            # What was published before the subscription: the caller reads again now.
            return
        _, event = live
        wait = FALLBACK_POLL_S if timeout_s is None else min(FALLBACK_POLL_S, timeout_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), wait)
        event.clear()

    async def why(self, user: str, job_id: str) -> Explanation | None:
        self._own(user)
        return (await self._ask("why", JobQuery(job_id=job_id), WhyAnswer)).explanation

    async def close(self) -> None:
        live, self._live = self._live, {}
        for subscription, _ in live.values():
            with contextlib.suppress(nats.errors.Error):  # the connection may be closing
                await subscription.unsubscribe()

    def _own(self, user: str | None) -> None:
        if user is not None and user != self.tenant:
            raise ClientError(
                f"logged in as tenant {self.tenant!r}: only {self.tenant}'s jobs can be read, "
                f"not {user}'s"
            )

    async def _ask(self, what: str, question: BaseModel, answer: type[A]) -> A:
        subject = query_subject(self.tenant, what)
        headers: dict[str, str] = {}
        inject_context(headers)  # the service's span joins the asking tool's trace, if any
        try:
            reply = await ask_query(
                self._nc,
                self.tenant,
                what,
                question.model_dump_json().encode(),
                timeout_s=REQUEST_TIMEOUT_S,
                headers=headers or None,
            )
        except nats.errors.NoRespondersError:
            raise NoCluster(
                f"nobody answers {subject}: is the cluster's query service running?"
            ) from None
        except nats.errors.TimeoutError:
            raise NoCluster(
                f"no answer on {subject} within {REQUEST_TIMEOUT_S:g}s: the query service is "
                f"down or busy, or this login ({self.tenant}) may not ask it"
            ) from None
        refusal = (reply.headers or {}).get(ERROR_HEADER)
        if refusal is not None:
            raise QueryRefused(f"{subject}: {refusal}")
        try:
            return answer.model_validate_json(reply.data)
        except ValidationError as exc:
            raise ClientError(f"{subject}: the query service's answer is invalid: {exc}") from None
