"""The async Python client: submit and cancel jobs, read the cluster's state, follow a job.

    async with await GfairClient.connect("nats://127.0.0.1:4222") as gfair:
        submitted = await gfair.submit("alice", 2, ["python", "train.py"], wait="running")
        async for event in gfair.watch("alice", submitted.job_id):
            print(event.envelope.type)

Writes are events (`JobSubmitted`, `JobCancelRequested`, `NodeUncordoned`) published exactly as
any tool may; reads come from the services' key-value records and the job's event history. The
client holds no state of its own, so any number of them can run side by side.

Following a job reads its events from the stream, from a position on: a submission starts after
its own stored position, so waiting on a reused job id never mistakes the old job's events for
the new one's. New events are picked up by polling (every `poll_interval_s`), which works on
every bus and costs one stream lookup per poll when nothing happened.
"""

from __future__ import annotations

import asyncio
import dataclasses
import getpass
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Literal, Self

from pydantic import ValidationError

from gfair.bus.history import HistoricalEvent
from gfair.bus.job_output import OutputChunk
from gfair.bus.publisher import EventPublisher
from gfair.bus.transport import Bus, BusError, NoStreamForSubject, PubAck
from gfair.client.connection import ConnectOptions, connect_bus, split_servers
from gfair.client.errors import ClientError, NoCluster, UnknownJob, WaitTimeout
from gfair.client.explanation import Explanation, explain
from gfair.client.query_access import QueryAccess
from gfair.client.state_access import DirectAccess, StateAccess
from gfair.client.views import (
    JobDetails,
    PoolUsage,
    Submitted,
    UserSummary,
    UsersView,
)
from gfair.core.shares_file import SharesFileError, changes, parse_shares, render_shares
from gfair.core.shares_tree import ShareTree
from gfair.events.envelope import Envelope, EventData
from gfair.events.errors import describe_validation_error
from gfair.events.job_array import ArrayMembership
from gfair.events.jobs import JobAccepted, JobEvent, JobHeld, JobPlaced, JobRejected
from gfair.events.nodes import NodeUncordoned
from gfair.events.scheduling import SharesChanged
from gfair.events.states import JobState
from gfair.events.submission import JobCancelRequested, JobSubmitted, new_job_id
from gfair.state.job_record import JobRecord
from gfair.state.node_record import NodeRecord
from gfair.state.share_record import SharesRecord
from gfair.state.stride_record import StrideRecord

# How far `submit` waits: not at all, until admitted (or rejected), until it runs, until it ends.
WaitFor = Literal["none", "accepted", "running", "ended"]


class InvalidRequest(ClientError):
    """The request itself is malformed (a bad user name, no command, ...)."""


class GfairClient:
    def __init__(
        self,
        bus: Bus,
        *,
        source: str = "gfair-client",
        poll_interval_s: float = 0.2,
        owns_bus: bool = False,
        access: StateAccess | None = None,
    ) -> None:
        self._bus = bus
        self._access: StateAccess = access or DirectAccess(bus, poll_interval_s=poll_interval_s)
        self._publisher = EventPublisher(bus, source)
        self._poll_interval_s = poll_interval_s
        self._owns_bus = owns_bus

    @classmethod
    async def connect(
        cls,
        servers: str | Sequence[str] | None = None,
        *,
        options: ConnectOptions | None = None,
        poll_interval_s: float = 0.2,
    ) -> GfairClient:
        """Connect to NATS; `NotReachable` if nobody answers.

        `servers`, else those of `options`, else `GFAIR_NATS_URL`, else the context of a running
        `gfair up` (`gfair.client.cluster_context`), else ``nats://127.0.0.1:4222``.
        """
        options = options or ConnectOptions()
        if servers is not None:
            options = dataclasses.replace(options, servers=split_servers(servers))
        bus = await connect_bus(options)
        tenant = options.tenant()
        access = QueryAccess(bus.client, tenant) if tenant is not None else None
        return cls(
            bus,
            source=options.name,
            poll_interval_s=poll_interval_s,
            owns_bus=True,
            access=access,
        )

    @property
    def bus(self) -> Bus:
        return self._bus

    async def close(self) -> None:
        await self._access.close()
        if self._owns_bus:
            await self._bus.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- writes ---------------------------------------------------------------------------

    async def submit(
        self,
        user: str,
        gpus: int,
        command: Sequence[str],
        *,
        tickets: float | None = None,
        job_type: str | None = None,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        working_dir: str | None = None,
        image: str | None = None,
        mounts: Sequence[str] = (),
        job_id: str | None = None,
        max_retries: int | None = None,
        array: ArrayMembership | None = None,
        after_ok: Sequence[str] = (),
        prepare: bool = False,
        wait: WaitFor = "accepted",
        timeout_s: float | None = 30.0,
    ) -> Submitted:
        """Submit a job (`submit_job`) made of these fields; `job_id` defaults to a fresh one
        (`new_job_id(name)`)."""
        try:
            data = JobSubmitted(
                user=user,
                job_id=job_id or new_job_id(name),
                gpus=gpus,
                command=tuple(command),
                tickets=tickets,
                job_type=job_type,
                name=name,
                env=dict(env or {}),
                working_dir=working_dir,
                image=image,
                mounts=tuple(mounts),
                max_retries=max_retries,
                array=array,
                after_ok=tuple(after_ok),
                prepare=prepare,
            )
        except ValidationError as exc:
            raise InvalidRequest(describe_validation_error(exc, root="")) from None
        return await self.submit_job(data, wait=wait, timeout_s=timeout_s)

    async def submit_job(
        self, data: JobSubmitted, *, wait: WaitFor = "accepted", timeout_s: float | None = 30.0
    ) -> Submitted:
        """Submit `data`; with `wait`, return once it is accepted (or rejected), running, or
        ended. Raises `WaitTimeout` when the awaited state does not come within `timeout_s`
        (None: no limit; the job is submitted all the same). Whatever `wait` says, a job that
        ends sooner returns its final state."""
        envelope, ack = await self._publish(data)
        submitted = Submitted(data.user, data.job_id, envelope.id, JobState.SUBMITTED)
        if wait == "none":
            return submitted
        wanted = {JobState.RUNNING} if wait != "ended" else set()
        if wait == "accepted":
            wanted |= {JobState.HELD, JobState.QUEUED, JobState.PLACED, JobState.SUSPENDED}
        servers: tuple[str, ...] = ()
        events = self._follow(data.user, data.job_id, ack.sequence + 1, timeout_s)
        async with aclosing(events):
            async for event in events:
                if isinstance(event.data, JobPlaced):
                    servers = event.data.servers
                state = _state_of(event.data)
                if state is None:
                    continue
                if isinstance(event.data, JobRejected):
                    return Submitted(
                        data.user,
                        data.job_id,
                        envelope.id,
                        state,
                        reason=event.data.reason,
                        code=event.data.code,
                    )
                if state in wanted or state.terminal:
                    reason = getattr(event.data, "reason", None)
                    return Submitted(
                        data.user, data.job_id, envelope.id, state, reason=reason, servers=servers
                    )
        raise WaitTimeout(
            f"job {data.user}/{data.job_id} was submitted but not {wait} within {timeout_s:g}s"
        )

    async def admitted(
        self, user: str, job_ids: Sequence[str], *, timeout_s: float | None = 30.0
    ) -> dict[str, JobRecord]:
        """The records of `user`'s jobs `job_ids` once placement decided each one's admission
        (held, queued, rejected, ...): for many submissions at once, such as an array's.
        `WaitTimeout` when some are still undecided after `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        wanted = set(job_ids)
        found: dict[str, JobRecord] = {}
        while True:
            for record in await self.jobs(user):
                if record.job_id in wanted:
                    found[record.job_id] = record
            if len(found) == len(wanted):
                return found
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"{len(wanted) - len(found)} of {len(wanted)} jobs of {user} were submitted "
                    f"but not admitted within {timeout_s:g}s"
                )
            await asyncio.sleep(self._poll_interval_s)

    async def array_members(self, user: str, array_id: str) -> list[JobRecord]:
        """The records of the jobs of `user`'s array `array_id`, by index (none: no such array)."""
        members = [
            r
            for r in await self.jobs(user)
            if r.submission.array is not None and r.submission.array.id == array_id
        ]
        return sorted(members, key=lambda r: r.submission.array.index if r.submission.array else 0)

    async def wait(self, user: str, job_id: str, *, timeout_s: float | None = None) -> JobState:
        """The state the job ends in (completed, failed, cancelled, rejected), once it ends.

        Only its latest life counts: a job id submitted again after an earlier job of that id
        ended waits for the new one. `UnknownJob` if the job does not exist (yet: a submission
        placement has not taken in), `WaitTimeout` if it does not end within `timeout_s`.
        """
        details = await self.job(user, job_id)
        events = details.events
        life = max(
            (
                i
                for i, e in enumerate(events)
                if isinstance(e.data, (JobHeld, JobAccepted, JobRejected))
            ),
            default=0,
        )
        for event in events[life:]:
            state = _state_of(event.data)
            if state is not None and state.terminal:
                return state
        if details.state.terminal:  # ended before its events were kept, or they expired
            return details.state
        start = events[-1].sequence + 1 if events else 1
        if (state := await self._end_state(user, job_id, start, timeout_s)) is not None:
            return state
        raise WaitTimeout(f"job {user}/{job_id} did not end within {timeout_s:g}s")

    async def cancel(
        self,
        user: str,
        job_id: str,
        *,
        reason: str | None = None,
        wait: bool = True,
        timeout_s: float = 30.0,
    ) -> JobState:
        """Ask to cancel a job; the state it ends in (or is in, when `wait` is False).

        A job that already ended is left alone and its final state returned.
        """
        details = await self.job(user, job_id, with_events=False)
        if details.state.terminal:
            return details.state
        try:
            data = JobCancelRequested(user=user, job_id=job_id, reason=reason)
        except ValidationError as exc:
            raise InvalidRequest(describe_validation_error(exc, root="")) from None
        _, ack = await self._publish(data)
        if not wait:
            return details.state
        if (state := await self._end_state(user, job_id, ack.sequence + 1, timeout_s)) is not None:
            return state
        raise WaitTimeout(f"job {user}/{job_id}: cancel requested, not done within {timeout_s:g}s")

    async def uncordon(
        self, node_id: str, *, operator: str | None = None, reason: str | None = None
    ) -> Envelope:
        """Clear a node's quarantine (the failure detector acts on it)."""
        if self._access.tenant is not None:
            # Said at once: the server would drop the publish, and the client wait it out.
            raise ClientError(
                f"uncordon is an operator's command; {self._access.tenant!r} is a tenant's "
                "login (log in as operator)"
            )
        if await self._access.node(node_id) is None:
            raise ClientError(f"unknown node {node_id!r}")
        try:
            data = NodeUncordoned(node_id=node_id, operator=operator or _operator(), reason=reason)
        except ValidationError as exc:
            raise InvalidRequest(describe_validation_error(exc, root="")) from None
        envelope, _ = await self._publish(data)
        return envelope

    async def change_shares(
        self,
        tree: ShareTree,
        *,
        operator: str | None = None,
        reason: str | None = None,
    ) -> SharesChanged:
        """Put `tree` in force (docs/design.md §1.1): the trading auction takes it for its next
        allocation, no restart; the event, with what changed, is the audit trail."""
        if self._access.tenant is not None:
            raise ClientError(
                f"changing the shares is an operator's command; {self._access.tenant!r} is a "
                "tenant's login (log in as operator)"
            )
        record = await self.shares()
        try:
            before = parse_shares(record.shares if record is not None else "", "shares in force")
        except SharesFileError:
            before = ShareTree()  # written by another version: every line reads as new
        try:
            data = SharesChanged(
                operator=operator or _operator(),
                reason=reason,
                shares=render_shares(tree),
                changes=tuple(changes(before, tree)),
            )
        except ValidationError as exc:
            raise InvalidRequest(describe_validation_error(exc, root="")) from None
        await self._publish(data)
        return data

    async def shares_in_force(self) -> ShareTree:
        """The shares tree the trading auction allocates with (empty: flat tickets)."""
        record = await self.shares()
        if record is None:
            raise ClientError(
                "no allocation yet: the trading auction has not published the shares in force "
                "(`gfair shares apply FILE` puts a whole file in force)"
            )
        return parse_shares(record.shares, "shares in force")

    async def _publish(self, data: EventData) -> tuple[Envelope, PubAck]:
        envelope = Envelope.wrap(data, source=self._publisher.source)
        try:
            ack = await self._publisher.publish_envelope(envelope)
        except NoStreamForSubject as exc:
            raise NoCluster(
                f"nothing stores {envelope.subject}: no gfair cluster on this NATS "
                "(start one with `gfair up`)"
            ) from exc
        except BusError as exc:
            raise ClientError(f"publishing {envelope.subject} failed: {exc}") from exc
        return envelope, ack

    # -- reads ----------------------------------------------------------------------------

    async def jobs(self, user: str | None = None, state: JobState | None = None) -> list[JobRecord]:
        """Job records, oldest first; `user` and `state` narrow them."""
        records = await self._access.job_records(user)
        if state is not None:
            records = [r for r in records if r.state is state]
        return sorted(records, key=lambda r: (r.created_at, r.user, r.job_id))

    async def job(self, user: str, job_id: str, *, with_events: bool = True) -> JobDetails:
        """A job's record and events; `UnknownJob` if neither exists."""
        found = await self._access.job(user, job_id)
        events: list[HistoricalEvent] = []
        if with_events or found.record is None:
            events = [e async for e in self._access.events(user, job_id, 1)]
        if found.record is None and not events:
            raise UnknownJob(f"no job {user}/{job_id}")
        return JobDetails(
            user=user,
            job_id=job_id,
            record=found.record,
            events=tuple(events),
            profile=found.profile,
            failures=found.failures,
        )

    async def nodes(self) -> list[NodeRecord]:
        return await self._access.nodes()

    async def users(self) -> UsersView:
        """Each active user's fair share, entitlement and received GPU time, per pool."""
        shares = await self.shares()
        stride = await self.stride()
        usage = stride.usage if stride is not None else {}
        elapsed = 0.0
        if stride is not None:
            elapsed = max((stride.updated_at - stride.usage_since).total_seconds(), 0.0)
        names = sorted(set(shares.users if shares is not None else ()) | set(usage))
        pools = list(shares.capacity) if shares is not None else []
        for pool_usage in usage.values():
            pools += [p for p in pool_usage if p not in pools]
        summaries = []
        for name in names:
            share = shares.users.get(name) if shares is not None else None
            used = usage.get(name, {})
            summaries.append(
                UserSummary(
                    user=name,
                    tickets=share.tickets if share is not None else None,
                    jobs=share.jobs if share is not None else 0,
                    demand=share.demand if share is not None else 0,
                    pools={
                        pool: PoolUsage(
                            pool=pool,
                            fair=share.pools[pool].fair if share and pool in share.pools else 0.0,
                            entitled=(
                                share.pools[pool].entitled if share and pool in share.pools else 0.0
                            ),
                            gpu_seconds=used.get(pool, 0.0),
                            received=used.get(pool, 0.0) / elapsed if elapsed > 0 else 0.0,
                        )
                        for pool in pools
                    },
                    throughput_fair=share.throughput_fair if share is not None else 0.0,
                    throughput_entitled=share.throughput_entitled if share is not None else 0.0,
                    account=shares.members.get(name, "") if shares is not None else "",
                )
            )
        return UsersView(
            users=summaries,
            capacity=dict(shares.capacity) if shares is not None else {},
            trades=shares.trades if shares is not None else (),
            revision=shares.revision if shares is not None else None,
            computed_at=shares.computed_at if shares is not None else None,
            usage_since=stride.usage_since if stride is not None else None,
            as_of=stride.updated_at if stride is not None else None,
        )

    async def shares(self) -> SharesRecord | None:
        return await self._access.shares()

    async def stride(self) -> StrideRecord | None:
        return await self._access.stride()

    async def why(self, user: str, job_id: str, *, viewer: str | None = None) -> Explanation:
        """Why the job is where it is: what it waits for, or how it ended. With `viewer`, other
        users' jobs go unnamed (the query service answering a tenant)."""
        answered = await self._access.why(user, job_id)
        if answered is not None:
            return answered
        details = await self.job(user, job_id)
        servers = details.record.servers if details.record is not None else ()
        nodes = [node for node in [await self._access.node(s) for s in servers] if node]
        dependencies: dict[str, JobState] = {}
        if details.record is not None:
            for dependency in details.record.submission.after_ok:
                found = await self._access.job_record(user, dependency)
                if found is not None:
                    dependencies[dependency] = found.state
        return explain(
            details,
            stride=await self.stride(),
            shares=await self.shares(),
            nodes=nodes,
            now=datetime.now(UTC),
            dependencies=dependencies,
            viewer=viewer,
        )

    def events(
        self, user: str | None = None, job_id: str | None = None, *, start: int = 1
    ) -> AsyncGenerator[HistoricalEvent, None]:
        """Job events stored so far, from stream sequence `start` on: one job's, one user's, or
        (neither given) every job's the login may read."""
        return self._access.events(user, job_id, start)

    def output(
        self, user: str, job_id: str, *, start: int = 1
    ) -> AsyncGenerator[OutputChunk, None]:
        """What the job wrote to stdout and stderr, as stored so far from `start` on."""
        return self._access.output(user, job_id, start)

    def cleared_trades(self, *, start: int = 1) -> AsyncGenerator[int, None]:
        """Stream sequences of the trade clearings from `start` on (none for a tenant)."""
        return self._access.cleared_trades(start)

    async def watch(
        self,
        user: str,
        job_id: str,
        *,
        from_start: bool = True,
        until_terminal: bool = True,
        timeout_s: float | None = None,
    ) -> AsyncGenerator[HistoricalEvent, None]:
        """The job's events as they happen (from its first one, or from now on).

        Ends after a terminal event when `until_terminal`, or when `timeout_s` passes.
        """
        start = 1
        if not from_start:
            async for event in self._access.events(user, job_id, 1):
                start = event.sequence + 1
        events = self._follow(user, job_id, start, timeout_s)
        async with aclosing(events):
            async for event in events:
                yield event
                state = _state_of(event.data)
                if until_terminal and state is not None and state.terminal:
                    return

    # -- plumbing -------------------------------------------------------------------------

    async def _end_state(
        self, user: str, job_id: str, start: int, timeout_s: float | None
    ) -> JobState | None:
        """The terminal state of the job's first terminal event from `start`; None past timeout."""
        events = self._follow(user, job_id, start, timeout_s)
        async with aclosing(events):
            async for event in events:
                state = _state_of(event.data)
                if state is not None and state.terminal:
                    return state
        return None

    async def _follow(
        self, user: str, job_id: str, start: int, timeout_s: float | None
    ) -> AsyncGenerator[HistoricalEvent, None]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            # Read each batch to its end before handing any of it out: a history read left
            # half-way when the caller stops would delete its consumer only when collected,
            # possibly after the connection closed.
            batch = [event async for event in self._access.events(user, job_id, start)]
            for event in batch:
                start = event.sequence + 1
                yield event
            if deadline is not None and time.monotonic() >= deadline:
                return
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            await self._access.changed(user, job_id, left)


def _state_of(data: EventData) -> JobState | None:
    if isinstance(data, JobEvent):
        return data.JOB_STATE
    return None


def _operator() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "operator"


__all__ = ["GfairClient", "InvalidRequest", "WaitFor"]
