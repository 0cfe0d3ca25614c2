"""Answering the query protocol (`gfair.client.queries`) for the user a request's subject names.

The subject is the caller's identity: NATS lets a tenant publish on its own
``gfair.query.<tenant>.*`` only, so every answer is about that user alone. Records are read as
the services keep them (`DirectAccess`) and cut down to the caller's part (`scope`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import TypeVar

from pydantic import BaseModel, ValidationError

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
from gfair_services.query.scope import own_node, own_shares, own_stride

T = TypeVar("T")
Item = TypeVar("Item", bound=BaseModel)


class QueryRefused(Exception):
    """The question cannot be answered; the message says why, for the caller to read."""


class QueryResponder:
    def __init__(self, access: DirectAccess, client: GfairClient) -> None:
        self._access = access
        self._client = client

    async def answer(self, subject: str, body: bytes) -> BaseModel:
        """The answer to the question `body` asked on `subject`; `QueryRefused` if none."""
        try:
            asked = parse_query_subject(subject)
        except SubjectError as exc:
            raise QueryRefused(str(exc)) from None
        kinds = QUERIES.get(asked.what)
        if kinds is None:
            raise QueryRefused(f"no query {asked.what!r}; one of: {', '.join(sorted(QUERIES))}")
        try:
            question = kinds[0].model_validate_json(body or b"{}")
        except ValidationError as exc:
            raise QueryRefused(describe_validation_error(exc, root="")) from None
        user = asked.user
        try:
            return await self._dispatch(user, asked.what, question)
        except ClientError as exc:
            raise QueryRefused(str(exc)) from None

    async def _dispatch(self, user: str, what: str, question: BaseModel) -> BaseModel:
        access = self._access
        match what, question:
            case "jobs", JobsQuery(after=after):
                records = sorted(await access.job_records(user), key=lambda r: r.job_id)
                kept = [r for r in records if after is None or r.job_id > after]
                jobs, more = _page(kept)
                return JobsPage(records=tuple(jobs), next=jobs[-1].job_id if more else None)
            case "job", JobQuery(job_id=job_id):
                return await access.job(user, job_id)
            case "events", EventsQuery(job_id=job_id, start=start):
                events = await _first(
                    access.events(user, job_id, start),
                    lambda e: StoredEvent(
                        sequence=e.sequence, subject=e.envelope.subject, envelope=e.envelope
                    ),
                )
                events, more = _page(events)
                return EventsPage(
                    events=tuple(events), next=events[-1].sequence + 1 if more else None
                )
            case "output", OutputQuery(job_id=job_id, start=start):
                chunks = await _first(
                    access.output(user, job_id, start),
                    lambda c: StoredChunk(
                        output=c.output,
                        node=c.node,
                        run=c.run,
                        offset=c.offset,
                        data=c.data,
                        end=c.end,
                        sequence=c.sequence,
                    ),
                )
                chunks, more = _page(chunks)
                return OutputPage(
                    chunks=tuple(chunks), next=chunks[-1].sequence + 1 if more else None
                )
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


async def _first(items: AsyncGenerator[T, None], convert: Callable[[T], Item]) -> list[Item]:
    """What `items` holds up to a page's worth and one more (so the page knows it is not the
    last), converted; the read stops there."""
    found: list[Item] = []
    size = 0
    async with aclosing(items):
        async for item in items:
            converted = convert(item)
            found.append(converted)
            size += len(converted.model_dump_json())
            if size > PAGE_BYTES:
                break
    return found


def _page(items: list[Item]) -> tuple[list[Item], bool]:
    """The first items that fit in a page (at least one), and whether any are left over."""
    size = 0
    for index, item in enumerate(items):
        size += len(item.model_dump_json())
        if size > PAGE_BYTES and index > 0:
            return items[:index], True
    return items, False
