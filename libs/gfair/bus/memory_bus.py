"""An in-memory bus with JetStream's semantics, for fast service tests.

Same contract as `NatsBus`: subjects with `*` and `>` wildcards, streams that must not
overlap, durable consumers shared by every binder (queue-group style), at-least-once delivery
(a nak, an ack timeout or a crashed handler brings the message back with `num_delivered`
incremented), dedup by message id within each stream's window, key-value with revisions.
Single event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gfair.bus.key_value import KeyValue
from gfair.bus.memory_kv import InMemoryKeyValue
from gfair.bus.subject_filter import matches_any, overlaps, validate_subject
from gfair.bus.topology import ConsumerSpec, DeliverPolicy, StreamSpec, Topology
from gfair.bus.transport import (
    MSG_ID_HEADER,
    BusError,
    Delivery,
    NoStreamForSubject,
    PubAck,
    PullConsumer,
    StoredMessage,
    TopologyConflict,
)


class _Signal:
    """Wakes every waiter on any change (publish, nak, close)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout_s: float) -> None:
        event = self._event
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)


@dataclass
class _Stream:
    spec: StreamSpec
    messages: list[StoredMessage] = field(default_factory=list)
    # msg id -> (expiry on the monotonic clock, sequence it was stored at)
    seen_ids: dict[str, tuple[float, int]] = field(default_factory=dict)

    @property
    def last_sequence(self) -> int:
        return len(self.messages)

    def store(
        self, subject: str, payload: bytes, headers: dict[str, str], msg_id: str | None
    ) -> PubAck:
        now = time.monotonic()
        if msg_id is not None:
            self._forget_expired(now)
            seen = self.seen_ids.get(msg_id)
            if seen is not None:
                return PubAck(stream=self.spec.name, sequence=seen[1], duplicate=True)
        sequence = self.last_sequence + 1
        self.messages.append(
            StoredMessage(self.spec.name, sequence, subject, bytes(payload), headers)
        )
        if msg_id is not None:
            self.seen_ids[msg_id] = (now + self.spec.duplicate_window_s, sequence)
        return PubAck(stream=self.spec.name, sequence=sequence)

    def _forget_expired(self, now: float) -> None:
        expired = [k for k, (expiry, _) in self.seen_ids.items() if expiry <= now]
        for key in expired:
            del self.seen_ids[key]


@dataclass
class _Pending:
    num_delivered: int
    # When the message becomes deliverable again: ack wait after a delivery, delay after a nak.
    due: float


class _ConsumerState:
    def __init__(self, spec: ConsumerSpec, stream: _Stream, signal: _Signal) -> None:
        self.spec = spec
        self.stream = stream
        self.signal = signal
        self.pending: dict[int, _Pending] = {}
        self.cursor = self._start_sequence(spec, stream)
        # With last_per_subject, history up to `_history_end` is reduced to `_only` (the last
        # message of each subject); anything published later is delivered in full.
        self._history_end = 0
        self._only: set[int] = set()
        if spec.deliver_policy is DeliverPolicy.LAST_PER_SUBJECT:
            latest: dict[str, int] = {}
            for message in stream.messages:
                if matches_any(spec.filter_subjects, message.subject):
                    latest[message.subject] = message.sequence
            self._history_end = stream.last_sequence
            self._only = set(latest.values())

    @staticmethod
    def _start_sequence(spec: ConsumerSpec, stream: _Stream) -> int:
        match spec.deliver_policy:
            case DeliverPolicy.NEW:
                return stream.last_sequence + 1
            case DeliverPolicy.LAST:
                return max(stream.last_sequence, 1)
            case DeliverPolicy.BY_START_SEQUENCE:
                assert spec.start_sequence is not None
                return spec.start_sequence
            case _:
                return 1

    def take(self, batch: int) -> list[Delivery]:
        now = time.monotonic()
        out: list[Delivery] = []
        for sequence in sorted(self.pending):
            if len(out) == batch:
                return out
            pending = self.pending[sequence]
            if pending.due <= now:
                pending.num_delivered += 1
                pending.due = now + self.spec.ack_wait_s
                out.append(self._delivery(sequence, pending.num_delivered))
        while (
            len(out) < batch
            and self.cursor <= self.stream.last_sequence
            and len(self.pending) < self.spec.max_ack_pending
        ):
            sequence = self.cursor
            self.cursor += 1
            message = self.stream.messages[sequence - 1]
            if sequence <= self._history_end and sequence not in self._only:
                continue
            if not matches_any(self.spec.filter_subjects, message.subject):
                continue
            self.pending[sequence] = _Pending(1, now + self.spec.ack_wait_s)
            out.append(self._delivery(sequence, 1))
        return out

    def unread(self) -> int:
        """Messages not yet delivered."""
        unread = 0
        for message in self.stream.messages[self.cursor - 1 :]:
            sequence = message.sequence
            if sequence <= self._history_end and sequence not in self._only:
                continue
            if matches_any(self.spec.filter_subjects, message.subject):
                unread += 1
        return unread

    def backlog(self) -> int:
        """Messages not yet delivered, plus those delivered and not yet acknowledged."""
        return len(self.pending) + self.unread()

    def next_due(self) -> float | None:
        return min((p.due for p in self.pending.values()), default=None)

    def _delivery(self, sequence: int, num_delivered: int) -> Delivery:
        return _MemoryDelivery(self, self.stream.messages[sequence - 1], num_delivered)

    def settle(self, sequence: int) -> None:
        self.pending.pop(sequence, None)

    def reschedule(self, sequence: int, delay_s: float) -> None:
        pending = self.pending.get(sequence)
        if pending is not None:
            pending.due = time.monotonic() + delay_s
            self.signal.notify()


class _MemoryDelivery:
    def __init__(self, state: _ConsumerState, message: StoredMessage, num_delivered: int) -> None:
        self._state = state
        self._message = message
        self._num_delivered = num_delivered

    @property
    def subject(self) -> str:
        return self._message.subject

    @property
    def data(self) -> bytes:
        return self._message.data

    @property
    def headers(self) -> Mapping[str, str]:
        return self._message.headers

    @property
    def stream(self) -> str:
        return self._message.stream

    @property
    def stream_sequence(self) -> int:
        return self._message.sequence

    @property
    def stored_at(self) -> datetime:
        return self._message.stored_at

    @property
    def num_delivered(self) -> int:
        return self._num_delivered

    async def ack(self) -> None:
        self._state.settle(self._message.sequence)

    async def nak(self, delay_s: float | None = None) -> None:
        self._state.reschedule(self._message.sequence, delay_s or 0.0)

    async def in_progress(self) -> None:
        self._state.reschedule(self._message.sequence, self._state.spec.ack_wait_s)

    async def term(self) -> None:
        self._state.settle(self._message.sequence)


class _MemoryPullConsumer:
    def __init__(self, bus: InMemoryBus, state: _ConsumerState) -> None:
        self._bus = bus
        self._state = state
        self._closed = False

    @property
    def spec(self) -> ConsumerSpec:
        return self._state.spec

    async def fetch(self, batch: int, timeout_s: float) -> list[Delivery]:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        deadline = time.monotonic() + timeout_s
        while True:
            if self._closed or self._bus.closed:
                raise BusError("consumer is closed")
            out = self._state.take(batch)
            if out:
                return out
            now = time.monotonic()
            if now >= deadline:
                return []
            wake = deadline
            due = self._state.next_due()
            if due is not None:
                wake = min(wake, due)
            # Yield even when something is due now, so that a publisher is never starved.
            await self._state.signal.wait(max(wake - now, 0.0))

    async def close(self) -> None:
        self._closed = True


class InMemoryBus:
    def __init__(self) -> None:
        self._streams: dict[str, _Stream] = {}
        self._consumers: dict[tuple[str, str], _ConsumerState] = {}
        self._buckets: dict[str, InMemoryKeyValue] = {}
        self._signal = _Signal()
        self.closed = False

    def _check_open(self) -> None:
        if self.closed:
            raise BusError("bus is closed")

    async def ensure_topology(self, topology: Topology) -> None:
        self._check_open()
        for spec in topology.streams:
            self._ensure_stream(spec)
        for consumer in topology.consumers:
            self._ensure_consumer(consumer)
        for bucket in topology.buckets:
            if bucket.name not in self._buckets:
                self._buckets[bucket.name] = InMemoryKeyValue(bucket)

    def _ensure_stream(self, spec: StreamSpec) -> None:
        for other in self._streams.values():
            if other.spec.name == spec.name:
                continue
            for mine in spec.subjects:
                for theirs in other.spec.subjects:
                    if overlaps(mine, theirs):
                        raise TopologyConflict(
                            f"stream {spec.name} subject {mine} overlaps {theirs} "
                            f"of stream {other.spec.name}"
                        )
        existing = self._streams.get(spec.name)
        if existing is None:
            self._streams[spec.name] = _Stream(spec)
        else:
            existing.spec = spec

    def _ensure_consumer(self, spec: ConsumerSpec) -> _ConsumerState:
        stream = self._streams.get(spec.stream)
        if stream is None:
            raise TopologyConflict(f"consumer {spec.durable}: no stream {spec.stream}")
        key = (spec.stream, spec.durable)
        state = self._consumers.get(key)
        if state is None:
            state = _ConsumerState(spec, stream, self._signal)
            self._consumers[key] = state
            return state
        old = state.spec
        if (old.deliver_policy, old.start_sequence) != (spec.deliver_policy, spec.start_sequence):
            raise TopologyConflict(
                f"consumer {spec.durable}: the deliver policy of an existing consumer cannot change"
            )
        state.spec = spec
        return state

    def _stream_for(self, subject: str) -> _Stream:
        for stream in self._streams.values():
            if matches_any(stream.spec.subjects, subject):
                return stream
        raise NoStreamForSubject(f"no stream stores subject {subject!r}")

    async def publish(
        self,
        subject: str,
        payload: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        msg_id: str | None = None,
    ) -> PubAck:
        self._check_open()
        validate_subject(subject)
        stored_headers = dict(headers or {})
        if msg_id is not None:
            stored_headers[MSG_ID_HEADER] = msg_id
        ack = self._stream_for(subject).store(subject, payload, stored_headers, msg_id)
        if not ack.duplicate:
            self._signal.notify()
        # A real publish is a network round trip; yielding keeps fairness between tasks alike.
        await asyncio.sleep(0)
        return ack

    async def consume(self, spec: ConsumerSpec) -> PullConsumer:
        self._check_open()
        return _MemoryPullConsumer(self, self._ensure_consumer(spec))

    async def unread(self, spec: ConsumerSpec) -> int:
        self._check_open()
        return self._ensure_consumer(spec).unread()

    async def key_value(self, bucket: str) -> KeyValue:
        self._check_open()
        try:
            return self._buckets[bucket]
        except KeyError:
            raise BusError(f"no key-value bucket {bucket!r}; declare it in the topology") from None

    async def history(
        self, stream: str, *, filter_subjects: tuple[str, ...] = (), start_sequence: int = 1
    ) -> AsyncIterator[StoredMessage]:
        self._check_open()
        try:
            found = self._streams[stream]
        except KeyError:
            raise BusError(f"no stream {stream!r}") from None
        end = found.last_sequence
        for message in found.messages[max(start_sequence, 1) - 1 : end]:
            if matches_any(filter_subjects, message.subject):
                yield message

    def backlog(self) -> int:
        """What consumers have yet to settle: unread or unacknowledged (a test inspection aid)."""
        return sum(state.backlog() for state in self._consumers.values())

    def stream_messages(self, stream: str) -> list[StoredMessage]:
        """Everything stored in `stream` (a test inspection aid)."""
        return list(self._streams[stream].messages)

    async def close(self) -> None:
        self.closed = True
        self._signal.notify()
