"""How the client reads the cluster's state: one interface, two ways of getting at it.

- `DirectAccess` reads the services' key-value records and streams itself. The services, the
  operator and an unauthenticated cluster read this way (and the query service answers with it).
- `QueryAccess` (`gfair.client.query_access`) asks the query service on request/reply. A
  tenant's login may not touch buckets or streams at all; the service answers its questions
  about its own jobs only.

Both return the same records, so every read of `GfairClient` (and so every CLI command) works
the same either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Protocol, TypeVar

import structlog
from pydantic import BaseModel

from gfair.bus.history import HistoricalEvent, read_history
from gfair.bus.job_output import OutputChunk, read_output
from gfair.bus.key_value import KeyValue
from gfair.bus.transport import Bus, BusError
from gfair.client.errors import NoCluster
from gfair.client.explanation import Explanation
from gfair.client.queries import JobAnswer
from gfair.events.scheduling import TradeCleared
from gfair.events.subjects import JOBS_STREAM, SCHED_STREAM, job_events_pattern
from gfair.state.buckets import JOBS, NODES, PROFILES, SHARES, STRIDE, UnreadableRecord, job_key
from gfair.state.job_failures import FAILURES, JobFailureRecord
from gfair.state.job_record import JobRecord, load_job, load_jobs
from gfair.state.node_record import NodeRecord, node_key
from gfair.state.profile_record import JobProfileRecord, job_profile_key
from gfair.state.share_record import SHARES_KEY, SharesRecord
from gfair.state.stride_record import StrideRecord, load_stride

_log = structlog.get_logger("gfair.client")

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class StateAccess(Protocol):
    """The reads behind `GfairClient`. `user` None means every user the reader may see."""

    @property
    def tenant(self) -> str | None:
        """The tenant the reader is held to (it sees and may act on its own jobs only); None
        for a login that reads everything (operator, services)."""
        ...

    async def job_records(self, user: str | None) -> list[JobRecord]: ...

    async def job_record(self, user: str, job_id: str) -> JobRecord | None: ...

    async def job(self, user: str, job_id: str) -> JobAnswer:
        """The job's record, profile and failure record, each None where there is none."""
        ...

    async def shares(self) -> SharesRecord | None: ...

    async def stride(self) -> StrideRecord | None: ...

    async def nodes(self) -> list[NodeRecord]: ...

    async def node(self, node_id: str) -> NodeRecord | None: ...

    def events(
        self, user: str | None, job_id: str | None, start: int
    ) -> AsyncGenerator[HistoricalEvent, None]:
        """Job events stored so far from stream sequence `start` on: one job's, a user's
        (`job_id` None) or everybody's (both None)."""
        ...

    def output(self, user: str, job_id: str, start: int) -> AsyncGenerator[OutputChunk, None]:
        """The job's output chunks stored so far, from stream sequence `start` on."""
        ...

    def cleared_trades(self, start: int) -> AsyncGenerator[int, None]:
        """The stream sequences of the trade clearings from `start` on; none for a reader that
        may not see the auction's events."""
        ...

    async def changed(self, user: str, job_id: str, timeout_s: float | None) -> None:
        """Return when the job may have new events, and after `timeout_s` at the latest."""
        ...

    async def why(self, user: str, job_id: str) -> Explanation | None:
        """The reader's own answer to `gfair why`; None: the client derives it from the
        records it reads."""
        ...

    async def close(self) -> None: ...


class DirectAccess:
    """Reads the records and streams on `bus` (a login that may read them all)."""

    tenant: str | None = None

    def __init__(self, bus: Bus, *, poll_interval_s: float = 0.2) -> None:
        self._bus = bus
        self._poll_interval_s = poll_interval_s

    async def job_records(self, user: str | None) -> list[JobRecord]:
        unreadable: list[UnreadableRecord] = []
        stored = await load_jobs(await self._bucket(JOBS.name), user=user, unreadable=unreadable)
        for error in unreadable:
            _log.warning("job record passed over", error=str(error))
        return [s.record for s in stored]

    async def job_record(self, user: str, job_id: str) -> JobRecord | None:
        stored = await load_job(await self._bucket(JOBS.name), user, job_id)
        return stored.record if stored is not None else None

    async def job(self, user: str, job_id: str) -> JobAnswer:
        return JobAnswer(
            record=await self.job_record(user, job_id),
            profile=await self._read(
                PROFILES.name, job_profile_key(user, job_id), JobProfileRecord
            ),
            failures=await self._read(FAILURES.name, job_key(user, job_id), JobFailureRecord),
        )

    async def shares(self) -> SharesRecord | None:
        return await self._read(SHARES.name, SHARES_KEY, SharesRecord)

    async def stride(self) -> StrideRecord | None:
        stored = await load_stride(await self._bucket(STRIDE.name))
        return stored.record if stored is not None else None

    async def nodes(self) -> list[NodeRecord]:
        bucket = await self._bucket(NODES.name)
        found = []
        for key in await bucket.keys():
            entry = await bucket.get(key)
            if entry is not None and entry.value:
                found.append(NodeRecord.model_validate_json(entry.value))
        return sorted(found, key=lambda n: n.node_id)

    async def node(self, node_id: str) -> NodeRecord | None:
        return await self._read(NODES.name, node_key(node_id), NodeRecord)

    def events(
        self, user: str | None, job_id: str | None, start: int
    ) -> AsyncGenerator[HistoricalEvent, None]:
        filters = () if user is None else (job_events_pattern(user, job_id),)
        history = read_history(
            self._bus, JOBS_STREAM.name, filter_subjects=filters, start_sequence=start
        )
        return _reading(history, JOBS_STREAM.name)

    def output(self, user: str, job_id: str, start: int) -> AsyncGenerator[OutputChunk, None]:
        chunks = read_output(self._bus, user, job_id, start_sequence=start)
        return _reading(chunks, "jobs' output (no GFAIR_LOGS stream?)")

    async def cleared_trades(self, start: int) -> AsyncGenerator[int, None]:
        history = read_history(
            self._bus,
            SCHED_STREAM.name,
            filter_subjects=(TradeCleared.subject_pattern(),),
            start_sequence=start,
        )
        async with aclosing(_reading(history, SCHED_STREAM.name)) as events:
            async for event in events:
                yield event.sequence

    async def changed(self, user: str, job_id: str, timeout_s: float | None) -> None:
        # Polling: a read of the stream costs one lookup when nothing happened.
        pause = self._poll_interval_s
        await asyncio.sleep(pause if timeout_s is None else min(pause, timeout_s))

    async def why(self, user: str, job_id: str) -> Explanation | None:
        return None

    async def close(self) -> None:
        return None

    async def _bucket(self, name: str) -> KeyValue:
        try:
            return await self._bus.key_value(name)
        except BusError as exc:
            raise NoCluster(
                f"no bucket {name}: no gfair cluster on this NATS, or it never started ({exc})"
            ) from exc

    async def _read(self, bucket: str, key: str, model: type[M]) -> M | None:
        """One record, or None when it (or its whole bucket) does not exist."""
        try:
            kv = await self._bus.key_value(bucket)
        except BusError:
            return None
        entry = await kv.get(key)
        if entry is None or not entry.value:
            return None
        return model.model_validate_json(entry.value)


async def _reading(items: AsyncGenerator[T, None], what: str) -> AsyncGenerator[T, None]:
    """`items`, closed when the reader stops; a bus error says the cluster is not there."""
    try:
        async with aclosing(items):
            async for item in items:
                yield item
    except BusError as exc:
        raise NoCluster(f"cannot read {what}: {exc}") from exc
