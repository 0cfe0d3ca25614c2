"""Durable pull consumers on JetStream (nats-py): configuration, deliveries, fetching."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping

import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from gfair.bus.topology import ConsumerSpec
from gfair.bus.transport import BusError, Delivery

_log = structlog.get_logger("gfair.bus.nats")


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
    __slots__ = ("_headers", "_msg", "_num_delivered", "_stream", "_stream_sequence")

    def __init__(self, msg: Msg) -> None:
        self._msg = msg
        meta = msg.metadata
        self._stream = meta.stream
        self._stream_sequence = meta.sequence.stream
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
    def __init__(
        self,
        spec: ConsumerSpec,
        sub: JetStreamContext.PullSubscription,
        *,
        recreate: Callable[[ConsumerSpec], Awaitable[None]],
        on_close: Callable[[NatsPullConsumer], None],
    ) -> None:
        self._spec = spec
        self._sub = sub
        self._recreate = recreate
        self._on_close = on_close

    @property
    def spec(self) -> ConsumerSpec:
        return self._spec

    async def fetch(self, batch: int, timeout_s: float) -> list[Delivery]:
        try:
            msgs = await self._sub.fetch(batch, timeout=timeout_s)
        # nats-py raises the built-in TimeoutError too when a fetch races a reconnect.
        except (nats.errors.TimeoutError, TimeoutError):
            return []
        except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError) as exc:
            # Reconnects are invisible here; a closed connection never comes back.
            raise BusError(f"consumer {self._spec.durable}: connection closed") from exc
        except nats.js.errors.ServiceUnavailableError:
            # The consumer has no leader yet (a cluster electing one): nothing to read now.
            await asyncio.sleep(min(timeout_s, 0.1))
            return []
        except nats.js.errors.NotFoundError:
            # The consumer vanished (deleted by an operator, or a memory-backed server
            # restarted): declare it again and carry on from its deliver policy.
            _log.warning("consumer missing, recreating", consumer=self._spec.durable)
            await self._recreate(self._spec)
            return []
        return [NatsDelivery(m) for m in msgs]

    async def close(self) -> None:
        self._on_close(self)
        closed = (nats.errors.ConnectionClosedError, nats.errors.BadSubscriptionError)
        with contextlib.suppress(*closed):
            await self._sub.unsubscribe()
