"""`Bus` on NATS JetStream (nats-py).

Connection loss is survived rather than reported: the client reconnects forever, buffered
publishes are flushed after reconnecting, a publish whose acknowledgement did not come back is
retried with the same message id (JetStream stores it once), and a pull that fails while
reconnecting simply returns no messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client as NatsClient
from nats.js import api

from gfair.bus.key_value import KeyValue
from gfair.bus.nats_consumer import NatsPullConsumer, consumer_config
from gfair.bus.nats_kv import NatsKeyValue
from gfair.bus.subject_filter import validate_subject
from gfair.bus.topology import BucketSpec, ConsumerSpec, StreamSpec, Topology
from gfair.bus.transport import (
    MSG_ID_HEADER,
    BusError,
    NoStreamForSubject,
    PubAck,
    PullConsumer,
    StoredMessage,
    TopologyConflict,
)

_log = structlog.get_logger("gfair.bus.nats")
T = TypeVar("T")

_STREAM_NAME_IN_USE = 10058


@dataclass(frozen=True, slots=True)
class NatsOptions:
    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    name: str | None = None
    connect_timeout_s: float = 2.0
    # A service may start before its server; keep trying this long before giving up.
    initial_connect_deadline_s: float = 30.0
    reconnect_wait_s: float = 0.5
    max_reconnect_attempts: int = -1
    api_timeout_s: float = 5.0
    publish_attempt_timeout_s: float = 2.0
    publish_deadline_s: float = 30.0
    drain_timeout_s: float = 10.0


def _stream_config(spec: StreamSpec) -> api.StreamConfig:
    return api.StreamConfig(
        name=spec.name,
        description=spec.description or None,
        subjects=list(spec.subjects),
        retention=api.RetentionPolicy.LIMITS,
        discard=api.DiscardPolicy.OLD,
        duplicate_window=spec.duplicate_window_s,
        max_age=spec.max_age_s,
        max_bytes=spec.max_bytes,
        storage=api.StorageType(spec.storage.value),
        num_replicas=spec.replicas,
    )


_TRANSIENT_API_ERRORS = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.ServiceUnavailableError,
)


class _ConnectionEvents:
    """Connection callbacks; quiet once the bus itself is closing the connection."""

    def __init__(self) -> None:
        self.closing = False

    async def on_error(self, exc: Exception) -> None:
        if not self.closing:
            _log.warning("nats connection error", error=repr(exc))

    async def on_disconnected(self) -> None:
        if not self.closing:
            _log.warning("nats disconnected")

    async def on_reconnected(self) -> None:
        _log.info("nats reconnected")


class NatsBus:
    def __init__(self, nc: NatsClient, options: NatsOptions) -> None:
        self._nc = nc
        self._events = _ConnectionEvents()
        self._pulls: set[NatsPullConsumer] = set()
        self._js = nc.jetstream(timeout=options.api_timeout_s)
        self._options = options

    @classmethod
    async def connect(cls, options: NatsOptions) -> NatsBus:
        events = _ConnectionEvents()
        deadline = time.monotonic() + options.initial_connect_deadline_s
        while True:
            nc = NatsClient()
            try:
                await nc.connect(
                    servers=list(options.servers),
                    name=options.name,
                    connect_timeout=options.connect_timeout_s,  # type: ignore[arg-type]
                    reconnect_time_wait=options.reconnect_wait_s,  # type: ignore[arg-type]
                    max_reconnect_attempts=options.max_reconnect_attempts,
                    drain_timeout=options.drain_timeout_s,  # type: ignore[arg-type]
                    error_cb=events.on_error,
                    disconnected_cb=events.on_disconnected,
                    reconnected_cb=events.on_reconnected,
                )
                bus = cls(nc, options)
                bus._events = events
                return bus
            except (nats.errors.NoServersError, OSError, TimeoutError) as exc:
                if time.monotonic() >= deadline:
                    raise BusError(f"cannot connect to {list(options.servers)}: {exc}") from exc
                await asyncio.sleep(options.reconnect_wait_s)

    @property
    def client(self) -> NatsClient:
        return self._nc

    async def _api(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """A JetStream API call, retried while the cluster is electing a leader or reconnecting.

        Only for idempotent calls (create-or-update, info, get).
        """
        deadline = time.monotonic() + self._options.publish_deadline_s
        while True:
            try:
                return await call()
            except _TRANSIENT_API_ERRORS as exc:
                if time.monotonic() >= deadline:
                    raise BusError(f"{what}: JetStream did not answer: {exc!r}") from exc
                _log.info("JetStream busy, retrying", call=what, error=repr(exc))
                await asyncio.sleep(self._options.reconnect_wait_s)

    async def wait_for_jetstream(self, timeout_s: float | None = None) -> None:
        """Until JetStream answers: a fresh cluster has no API until it elects a meta leader."""
        deadline = time.monotonic() + (timeout_s or self._options.publish_deadline_s)
        while True:
            problem: str
            try:
                # Short probes: the API's own timeout would make each miss cost seconds.
                reply = await self._nc.request(f"{api.DEFAULT_PREFIX}.INFO", b"", timeout=1.0)
                error = json.loads(reply.data).get("error")
                if error is None:
                    return
                problem = str(error.get("description", error))
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
                problem = repr(exc)
            if time.monotonic() >= deadline:
                raise BusError(f"JetStream not available: {problem}")
            await asyncio.sleep(self._options.reconnect_wait_s)

    async def ensure_topology(self, topology: Topology) -> None:
        await self.wait_for_jetstream()
        for stream in topology.streams:
            await self._ensure_stream(stream)
        for consumer in topology.consumers:
            await self.ensure_consumer(consumer)
        for bucket in topology.buckets:
            await self._ensure_bucket(bucket)

    async def _ensure_stream(self, spec: StreamSpec) -> None:
        config = _stream_config(spec)
        try:
            await self._api(f"add stream {spec.name}", lambda: self._js.add_stream(config))
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != _STREAM_NAME_IN_USE:
                raise TopologyConflict(f"stream {spec.name}: {exc.description}") from exc
            try:
                await self._api(
                    f"update stream {spec.name}", lambda: self._js.update_stream(config)
                )
            except nats.js.errors.APIError as update_exc:
                raise TopologyConflict(
                    f"stream {spec.name} exists and cannot be updated: {update_exc.description}"
                ) from update_exc

    async def ensure_consumer(self, spec: ConsumerSpec) -> None:
        try:
            config = consumer_config(spec)
            await self._api(
                f"add consumer {spec.durable}", lambda: self._js.add_consumer(spec.stream, config)
            )
        except nats.js.errors.APIError as exc:
            raise TopologyConflict(f"consumer {spec.durable}: {exc.description}") from exc

    async def _ensure_bucket(self, spec: BucketSpec) -> None:
        try:
            await self._api(f"bucket {spec.name}", lambda: self._js.key_value(spec.name))
            return
        except nats.js.errors.BucketNotFoundError:
            pass
        config = api.KeyValueConfig(
            bucket=spec.name,
            description=spec.description or None,
            history=spec.history,
            ttl=spec.ttl_s,
            storage=api.StorageType(spec.storage.value),
            replicas=spec.replicas,
        )
        await self._api(f"create bucket {spec.name}", lambda: self._js.create_key_value(config))

    async def publish(
        self,
        subject: str,
        payload: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        msg_id: str | None = None,
    ) -> PubAck:
        validate_subject(subject)
        base_headers = dict(headers or {})
        if msg_id is not None:
            base_headers[MSG_ID_HEADER] = msg_id
        options = self._options
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            elapsed = time.monotonic() - started
            try:
                ack = await self._js.publish(
                    subject,
                    payload,
                    timeout=options.publish_attempt_timeout_s,
                    headers=dict(base_headers),
                )
                if attempt > 1:
                    _log.info("publish succeeded after retry", subject=subject, attempt=attempt)
                return PubAck(stream=ack.stream, sequence=ack.seq, duplicate=bool(ack.duplicate))
            except nats.js.errors.NoStreamResponseError as exc:
                # Either no stream stores the subject (final), or its stream has no leader
                # right now: restarting, or electing one after a node died (retry).
                if await self._stream_exists_for(subject) is False:
                    raise NoStreamForSubject(f"no stream stores subject {subject!r}") from exc
                if elapsed >= options.publish_deadline_s:
                    raise BusError(f"stream for {subject!r} not answering") from exc
            except nats.js.errors.ServiceUnavailableError as exc:
                if elapsed >= options.publish_deadline_s:
                    raise BusError(f"JetStream unavailable for {subject!r}") from exc
            except (nats.errors.TimeoutError, nats.errors.ConnectionReconnectingError) as exc:
                # Without a message id a retry could store the event twice.
                if msg_id is None or elapsed >= options.publish_deadline_s:
                    raise BusError(f"publish to {subject!r} not acknowledged: {exc!r}") from exc
            _log.debug("publish retry", subject=subject, attempt=attempt)
            await asyncio.sleep(min(0.05 * 2**attempt, 1.0))

    async def _stream_exists_for(self, subject: str) -> bool | None:
        """Whether some stream captures `subject`; None when JetStream cannot say right now."""
        request = json.dumps({"subject": subject}).encode()
        try:
            reply = await self._nc.request(
                f"{api.DEFAULT_PREFIX}.STREAM.NAMES", request, timeout=1.0
            )
            answer = json.loads(reply.data)
        except (nats.errors.Error, ValueError):
            return None
        if "error" in answer:
            return None
        return bool(answer.get("streams"))

    async def consume(self, spec: ConsumerSpec) -> PullConsumer:
        await self.ensure_consumer(spec)
        sub = await self._js.pull_subscribe_bind(durable=spec.durable, stream=spec.stream)
        pull = NatsPullConsumer(
            spec, sub, recreate=self.ensure_consumer, on_close=self._pulls.discard
        )
        self._pulls.add(pull)
        return pull

    async def key_value(self, bucket: str) -> KeyValue:
        try:
            kv = await self._api(f"bucket {bucket}", lambda: self._js.key_value(bucket))
        except nats.js.errors.BucketNotFoundError:
            raise BusError(f"no key-value bucket {bucket!r}; declare it in the topology") from None
        return NatsKeyValue(kv, bucket, self)

    def history(
        self, stream: str, *, filter_subjects: tuple[str, ...] = (), start_sequence: int = 1
    ) -> AsyncIterator[StoredMessage]:
        return self.read(stream, filter_subjects=filter_subjects, start_sequence=start_sequence)

    async def read(
        self,
        stream: str,
        *,
        filter_subjects: tuple[str, ...] = (),
        start_sequence: int = 1,
        last_per_subject: bool = False,
    ) -> AsyncIterator[StoredMessage]:
        """Read through an ephemeral, unacknowledged consumer that is deleted afterwards.

        With `last_per_subject`, only the latest message of each subject (a bucket's keys).
        """
        try:
            info = await self._api(f"stream {stream}", lambda: self._js.stream_info(stream))
            end = info.state.last_seq
        except nats.js.errors.NotFoundError:
            raise BusError(f"no stream {stream!r}") from None
        if end < start_sequence:
            return
        name = f"history-{uuid.uuid4().hex}"
        filters = list(filter_subjects)
        config = api.ConsumerConfig(
            name=name,
            deliver_policy=(
                api.DeliverPolicy.LAST_PER_SUBJECT
                if last_per_subject
                else api.DeliverPolicy.BY_START_SEQUENCE
                if start_sequence > 1
                else api.DeliverPolicy.ALL
            ),
            opt_start_seq=start_sequence if start_sequence > 1 and not last_per_subject else None,
            ack_policy=api.AckPolicy.NONE,
            filter_subject=filters[0] if len(filters) == 1 else None,
            filter_subjects=filters if len(filters) > 1 else None,
            inactive_threshold=60.0,
            # A private read cursor: nothing to replicate, and it needs no quorum to exist.
            mem_storage=True,
            num_replicas=1,
        )
        created = await self._api(
            f"history of {stream}", lambda: self._js.add_consumer(stream, config)
        )
        sub = await self._js.pull_subscribe_bind(consumer=name, stream=stream)
        try:
            done = not created.num_pending
            progress_at = time.monotonic()
            while not done:
                try:
                    msgs = await sub.fetch(256, timeout=self._options.api_timeout_s)
                except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError):
                    # 503: in a cluster a new consumer answers only once it has a leader.
                    if time.monotonic() - progress_at > self._options.publish_deadline_s:
                        raise BusError(f"reading the history of {stream} stalled") from None
                    await asyncio.sleep(self._options.reconnect_wait_s)
                    continue
                progress_at = time.monotonic()
                for msg in msgs:
                    meta = msg.metadata
                    sequence = meta.sequence.stream
                    if sequence > end:
                        done = True
                        break
                    yield StoredMessage(
                        stream=stream,
                        sequence=sequence,
                        subject=msg.subject,
                        data=msg.data,
                        headers=msg.headers or {},
                    )
                    # Bounded by the history at call time: later publishes are not read.
                    if sequence == end or meta.num_pending == 0:
                        done = True
                        break
        finally:
            await sub.unsubscribe()
            # On failure the inactivity threshold removes it anyway.
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                await self._js.delete_consumer(stream, name)

    async def close(self) -> None:
        if self._nc.is_closed:
            return
        self._events.closing = True
        # A pull subscription holding an unread status message would stall the drain until
        # its timeout; nothing more will be fetched, so release them first.
        for pull in list(self._pulls):
            await pull.close()
        if self._nc.is_connected:
            try:
                await self._nc.drain()
                return
            except (nats.errors.Error, TimeoutError) as exc:
                _log.warning("drain failed, closing", error=repr(exc))
        await self._nc.close()
