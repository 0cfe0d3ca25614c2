"""Answering the query protocol (`gfair.client.queries`) for the user a request's subject names.

The subject is the caller's identity: NATS lets a tenant publish on its own
``gfair.query.<tenant>.*`` only, so every answer is about that user alone. Records are read as
the services keep them (`DirectAccess`) and cut down to the caller's part (`scope`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Generic, Self, TypeVar

from pydantic import BaseModel, ValidationError

from gfair.bus.history import HistoricalEvent
from gfair.bus.job_output import OutputChunk
from gfair.client import GfairClient
from gfair.client.errors import ClientError
from gfair.client.queries import (
    PAGE_BYTES,
    QUERIES,
    EventsPage,
    EventsQuery,
    JobQuery,
    JobsPage,
    JobsQuery,
    NodesAnswer,
    NoQuery,
    OutputPage,
    OutputQuery,
    SharesAnswer,
    StoredChunk,
    StoredEvent,
    StrideAnswer,
    WhyAnswer,
)
from gfair.client.state_access import DirectAccess
from gfair.events.errors import describe_validation_error
from gfair.events.subjects import SubjectError, parse_query_subject
from gfair.state.job_record import JobRecord
from gfair_services.query.scope import own_node, own_shares, own_stride

Item = TypeVar("Item", bound=BaseModel)
Found = TypeVar("Found")


class Unanswerable(Exception):
    """The question cannot be answered; the message says why, for the caller to read."""


class QueryResponder:
    def __init__(self, access: DirectAccess, client: GfairClient) -> None:
        self._access = access
        self._client = client

    async def answer(self, subject: str, body: bytes) -> BaseModel:
        """The answer to the question `body` asked on `subject`; `Unanswerable` if none."""
        try:
            asked = parse_query_subject(subject)
        except SubjectError as exc:
            raise Unanswerable(str(exc)) from None
        kinds = QUERIES.get(asked.what)
        if kinds is None:
            raise Unanswerable(f"no query {asked.what!r}; one of: {', '.join(sorted(QUERIES))}")
        try:
            question = kinds[0].model_validate_json(body or b"{}")
        except ValidationError as exc:
            raise Unanswerable(describe_validation_error(exc, root="")) from None
        user = asked.user
        try:
            return await self._dispatch(user, asked.what, question)
        except ClientError as exc:
            raise Unanswerable(str(exc)) from None

    async def _dispatch(self, user: str, what: str, question: BaseModel) -> BaseModel:
        access = self._access
        match what, question:
            case "jobs", JobsQuery(after=after):
                records = sorted(await access.job_records(user), key=lambda r: r.job_id)
                jobs = _Page[JobRecord]()
                for record in records:
                    if (after is None or record.job_id > after) and not jobs.add(record):
                        break
                last = jobs.items[-1].job_id if jobs.full else None
                return JobsPage(records=tuple(jobs.items), next=last)
            case "job", JobQuery(job_id=job_id):
                return await access.job(user, job_id)
            case "events", EventsQuery(job_id=job_id, start=start):
                events = await _Page[StoredEvent]().fill(access.events(user, job_id, start), _event)
                after_last = events.items[-1].sequence + 1 if events.full else None
                return EventsPage(events=tuple(events.items), next=after_last)
            case "output", OutputQuery(job_id=job_id, start=start):
                chunks = await _Page[StoredChunk]().fill(access.output(user, job_id, start), _chunk)
                after_last = chunks.items[-1].sequence + 1 if chunks.full else None
                return OutputPage(chunks=tuple(chunks.items), next=after_last)
            case "shares", NoQuery():
                shares = await access.shares()
                return SharesAnswer(record=own_shares(shares, user) if shares else None)
            case "stride", NoQuery():
                stride = await access.stride()
                return StrideAnswer(record=own_stride(stride, user) if stride else None)
            case "nodes", NoQuery():
                return NodesAnswer(records=tuple(own_node(n, user) for n in await access.nodes()))
            case "why", JobQuery(job_id=job_id):
                return WhyAnswer(explanation=await self._client.why(user, job_id, viewer=user))
        raise AssertionError(f"query {what!r} has no answer")  # QUERIES and this match agree


class _Page(Generic[Item]):
    """Items up to about `PAGE_BYTES` of JSON (at least one); `full` once one was turned away,
    so the asker knows to ask on from the last item kept."""

    def __init__(self) -> None:
        self.items: list[Item] = []
        self.full = False
        self._size = 0

    async def fill(
        self, source: AsyncGenerator[Found, None], item: Callable[[Found], Item]
    ) -> Self:
        """Add `item(found)` for what `source` yields until the page is full; close `source`."""
        async with aclosing(source):
            async for found in source:
                if not self.add(item(found)):
                    break
        return self

    def add(self, item: Item) -> bool:
        size = len(item.model_dump_json())
        if self.items and self._size + size > PAGE_BYTES:
            self.full = True
            return False
        self.items.append(item)
        self._size += size
        return True


def _event(e: HistoricalEvent) -> StoredEvent:
    return StoredEvent(sequence=e.sequence, subject=e.envelope.subject, envelope=e.envelope)


def _chunk(c: OutputChunk) -> StoredChunk:
    return StoredChunk.model_validate(c, from_attributes=True)  # the same fields
