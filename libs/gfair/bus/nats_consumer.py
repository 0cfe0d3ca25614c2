"""Durable pull consumers on JetStream (nats-py): configuration, deliveries, fetching."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime

import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api

from gfair.bus.topology import ConsumerSpec
from gfair.bus.transport import BusError, Delivery

_log = structlog.get_logger("gfair.bus.nats")

# How long past a pull request's expiry the server may stay silent before the consumer is
# looked up: a live consumer always answers an expired request, but a deleted one answers
# nothing.
_SILENCE_GRACE_S = 1.0
# After a look-up or declaration that did not come through, the next waits this long at first,
# doubling up to the most: a broker too slow to answer is not asked again and again.
_RECHECK_FIRST_S = 1.0
_RECHECK_MOST_S = 30.0


def consumer_config(spec: ConsumerSpec) -> api.ConsumerConfig:
    filters = list(spec.filter_subjects)
    return api.ConsumerConfig(
        name=spec.durable,
        durable_name=spec.durable,
        description=spec.description or None,
        deliver_policy=api.DeliverPolicy(spec.deliver_policy.value),
        opt_start_seq=spec.start_sequence,
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=spec.ack_wait_s,
        # The runner counts attempts and dead-letters; the server must never give up silently.
        max_deliver=-1,
        filter_subject=filters[0] if len(filters) == 1 else None,
        filter_subjects=filters if len(filters) > 1 else None,
        max_ack_pending=spec.max_ack_pending,
    )


class NatsDelivery:
    __slots__ = (
        "_headers",
        "_msg",
        "_num_delivered",
        "_stored_at",
        "_stream",
        "_stream_sequence",
    )

    def __init__(self, msg: Msg) -> None:
        self._msg = msg
        meta = msg.metadata
        self._stream = meta.stream
        self._stream_sequence = meta.sequence.stream
        # The ack subject carries the stored message's timestamp (server clock).
        self._stored_at = meta.timestamp
        self._num_delivered = meta.num_delivered
        self._headers: Mapping[str, str] = msg.headers or {}

    @property
    def subject(self) -> str:
        return self._msg.subject

    @property
    def data(self) -> bytes:
        return self._msg.data

    @property
    def headers(self) -> Mapping[str, str]:
        return self._headers

    @property
    def stream(self) -> str:
        return self._stream

    @property
    def stream_sequence(self) -> int:
        return self._stream_sequence

    @property
    def stored_at(self) -> datetime:
        return self._stored_at

    @property
    def num_delivered(self) -> int:
        return self._num_delivered

    async def ack(self) -> None:
        await self._msg.ack()

    async def nak(self, delay_s: float | None = None) -> None:
        await self._msg.nak(delay=delay_s)

    async def in_progress(self) -> None:
        await self._msg.in_progress()

    async def term(self) -> None:
        await self._msg.term()


class NatsPullConsumer:
    """Fetches from a durable pull consumer with at most one pull request open at a time.

    nats-py's own `fetch` takes whatever status message arrives for the request it just sent,
    even one left over from an earlier request (the expiry of an idle fetch that timed out a
    moment before the server said so). It then sends a second, lingering request and may
    return before that one is answered; the next events go to the orphaned request, and the
    fetch that receives them waits for a status that comes only when the orphan expires, up to
    the whole fetch timeout (it showed as ~0.7 s between a job's placement and its start).
    Here every request lingers until its expiry or until it is answered in full, and none is
    sent while one is open, so no status can be mistaken for another's; each fetch returns as
    soon as one event is in and takes along what else has arrived.
    """

    def __init__(
        self,
        spec: ConsumerSpec,
        client: NatsClient,
        *,
        api_prefix: str,
        recover: Callable[[ConsumerSpec, bool], Awaitable[bool]],
        on_close: Callable[[NatsPullConsumer], None],
    ) -> None:
        self._spec = spec
        self._client = client
        self._next_subject = f"{api_prefix}.CONSUMER.MSG.NEXT.{spec.stream}.{spec.durable}"
        self._inbox = client.new_inbox()
        self._queue: asyncio.Queue[Msg] = asyncio.Queue()
        self._sub: Subscription | None = None
        self._recover = recover
        self._on_close = on_close
        # The open request: how many events it may still bring, until when, on which connection.
        self._open_until = 0.0
        self._open_left = 0
        self._open_reconnects = -1
        # What the last status said to do before the next request.
        self._missing = False
        self._unavailable = False
        # When the server, silent since a request went out, should have answered it at the latest.
        self._silent_after: float | None = None
        # No look-up or declaration before then (`_RECHECK_FIRST_S`), and the wait after the next
        # one that fails.
        self._recheck_at = 0.0
        self._recheck_wait_s = _RECHECK_FIRST_S

    @property
    def spec(self) -> ConsumerSpec:
        return self._spec

    async def open(self) -> None:
        async def arrived(msg: Msg) -> None:
            self._queue.put_nowait(msg)

        self._sub = await self._client.subscribe(self._inbox, cb=arrived)

    async def fetch(self, batch: int, timeout_s: float) -> list[Delivery]:
        deliveries = self._take(batch)
        if deliveries:
            return deliveries
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            if not self._request_open():
                if not await self._ready(left):
                    continue
                await self._request(batch, left)
            try:
                msg = await asyncio.wait_for(self._queue.get(), left)
            except TimeoutError:
                return []
            first = self._accept(msg)
            if first is not None:
                return [first, *self._take(batch - 1)]

    async def _ready(self, left: float) -> bool:
        """Whether a request may go out now; after a refusal, recover first."""
        if self._missing:
            # The consumer was deleted (by an operator, or a memory-backed server restarted):
            # declare it again and carry on from its deliver policy.
            self._missing = False
            await self._look_up(left, missing=True)
        elif self._silent_after is not None and time.monotonic() > self._silent_after:
            # Deleted while no request was open, or declared again while its deletion was still
            # under way: requests to a consumer that does not exist go unanswered, or are
            # answered only by "no responders". Or the answer is merely late: a broker under
            # load, or a process too busy to read it in time (hundreds of consumers on one
            # connection, virtual nodes). So the consumer is looked up, and declared again only
            # if the server says it is gone: declaring it again for a late answer would only
            # add to the load that made the answer late.
            self._silent_after = None
            await self._look_up(left, missing=False)
        if self._unavailable:
            # Nobody answers for the consumer: no leader yet (a cluster electing one), or gone.
            self._unavailable = False
            await asyncio.sleep(min(left, 0.1))
            return False
        return True

    async def _look_up(self, left: float, *, missing: bool) -> None:
        """The consumer looked up and, where the server no longer has it (or said it was
        deleted: `missing`), declared again (`recover`); after one that fails, the next is put
        off, ever longer, while requests go on."""
        now = time.monotonic()
        if now < self._recheck_at:
            return
        try:
            # Within the fetch's time (or a little more): a stop must not wait out the API's
            # retries while a cluster elects a leader.
            await asyncio.wait_for(self._recover(self._spec, missing), max(left, 0.5))
        except Exception as exc:
            # The server may not answer yet (a cluster electing a leader, a broker under load):
            # the next silence or refusal past the wait tries again. (Info: under load every
            # consumer of a connection may say so, and the consumer goes on regardless.)
            _log.info(
                "looking up the consumer failed",
                consumer=self._spec.durable,
                error=repr(exc),
                again_in_s=self._recheck_wait_s,
            )
            self._recheck_at = time.monotonic() + self._recheck_wait_s
            self._recheck_wait_s = min(self._recheck_wait_s * 2, _RECHECK_MOST_S)
            return
        self._recheck_wait_s = _RECHECK_FIRST_S

    async def _request(self, batch: int, left: float) -> None:
        if self._client.is_closed or self._client.is_draining:
            raise BusError(f"consumer {self._spec.durable}: connection closed")
        # A little short of the wait, so the server's expiry reaches us before we give up.
        expires_s = max(left - 0.01, 0.001)
        request = {"batch": batch, "expires": int(expires_s * 1e9)}
        try:
            await self._client.publish(
                self._next_subject, json.dumps(request).encode(), reply=self._inbox
            )
        except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError) as exc:
            raise BusError(f"consumer {self._spec.durable}: connection closed") from exc
        now = time.monotonic()
        reconnects = self._client.stats["reconnects"]
        if self._silent_after is None or reconnects != self._open_reconnects:
            self._silent_after = now + expires_s + _SILENCE_GRACE_S
        self._open_until = now + expires_s
        self._open_left = batch
        self._open_reconnects = reconnects

    def _request_open(self) -> bool:
        # A reconnect drops the server's side of the request: the subscription moved on.
        return (
            self._open_left > 0
            and time.monotonic() < self._open_until
            and self._client.stats["reconnects"] == self._open_reconnects
        )

    def _take(self, limit: int) -> list[Delivery]:
        """What has arrived already, up to `limit` events, without waiting."""
        deliveries: list[Delivery] = []
        while len(deliveries) < limit and not self._queue.empty():
            delivery = self._accept(self._queue.get_nowait())
            if delivery is not None:
                deliveries.append(delivery)
        return deliveries

    def _accept(self, msg: Msg) -> Delivery | None:
        """An event, or None for a status (which may end the open request)."""
        status = JetStreamContext.is_status_msg(msg)
        if status != api.StatusCode.SERVICE_UNAVAILABLE:
            self._silent_after = None
        if not status:
            self._open_left -= 1
            return NatsDelivery(msg)
        if status == api.StatusCode.CONTROL_MESSAGE:
            return None  # a heartbeat: the request stays open
        self._open_left = 0
        description = str((msg.headers or {}).get(api.Header.DESCRIPTION, ""))
        if status == api.StatusCode.SERVICE_UNAVAILABLE:
            self._unavailable = True
        elif status == api.StatusCode.CONFLICT and "deleted" in description.lower():
            self._missing = True
        elif status not in (api.StatusCode.NO_MESSAGES, api.StatusCode.REQUEST_TIMEOUT):
            _log.info(
                "pull request ended", consumer=self._spec.durable, status=status, why=description
            )
        return None

    async def close(self) -> None:
        self._on_close(self)
        if self._sub is None:
            return
        closed = (nats.errors.ConnectionClosedError, nats.errors.BadSubscriptionError)
        with contextlib.suppress(*closed):
            await self._sub.unsubscribe()
        self._sub = None
