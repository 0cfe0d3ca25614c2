"""The one interface both buses implement: the real NATS JetStream one and the in-memory one.

It speaks bytes and headers, not events; the runtime (publisher, handler runner, history)
puts envelopes, tracing and dead-lettering on top, identically for both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from gfair.bus.key_value import KeyValue
from gfair.bus.topology import ConsumerSpec, Topology

MSG_ID_HEADER = "Nats-Msg-Id"


class BusError(RuntimeError):
    """The bus refused or could not carry out an operation."""


class NoStreamForSubject(BusError):
    """A publish on a subject that no stream stores (NATS answers 'no responders')."""


class PublishFailed(BusError):
    """A publish was not acknowledged in time, even after retries."""


class TopologyConflict(BusError):
    """A stream or consumer exists with settings that cannot be changed in place."""


@dataclass(frozen=True, slots=True)
class PubAck:
    stream: str
    sequence: int
    # True when the stream already held a message with this id (within its duplicate window):
    # nothing new was stored and `sequence` is the original's.
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message as read back from a stream's history."""

    stream: str
    sequence: int
    subject: str
    data: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    # When the stream stored it, by the server's clock.
    stored_at: datetime = field(default_factory=lambda: datetime.now(UTC))


class Delivery(Protocol):
    """One delivery of a stored message to a consumer; exactly one of ack/nak/term settles it."""

    @property
    def subject(self) -> str: ...
    @property
    def data(self) -> bytes: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def stream(self) -> str: ...
    @property
    def stream_sequence(self) -> int: ...
    @property
    def stored_at(self) -> datetime:
        """When the stream stored the message, by the server's clock (not the publisher's)."""
        ...

    @property
    def num_delivered(self) -> int:
        """1 on first delivery; redeliveries (nak, ack timeout, crash) count up."""
        ...

    async def ack(self) -> None: ...
    async def nak(self, delay_s: float | None = None) -> None: ...
    async def in_progress(self) -> None:
        """Restart the ack timer: the handler is still working on it."""
        ...

    async def term(self) -> None:
        """Never deliver this message again to this consumer."""
        ...


class PullConsumer(Protocol):
    @property
    def spec(self) -> ConsumerSpec: ...

    async def fetch(self, batch: int, timeout_s: float) -> list[Delivery]:
        """Up to `batch` deliveries; an empty list when none arrived within `timeout_s`."""
        ...

    async def close(self) -> None:
        """Stop receiving; unsettled deliveries return to the consumer after their ack wait."""
        ...


class Bus(Protocol):
    async def ensure_topology(self, topology: Topology) -> None:
        """Create or update streams, consumers and buckets; repeating it changes nothing."""
        ...

    async def publish(
        self,
        subject: str,
        payload: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        msg_id: str | None = None,
    ) -> PubAck:
        """Store a message; with `msg_id`, a repeat within the duplicate window is dropped."""
        ...

    async def consume(self, spec: ConsumerSpec) -> PullConsumer:
        """Bind to the durable consumer `spec` (creating it if needed); instances share it."""
        ...

    async def unread(self, spec: ConsumerSpec) -> int:
        """Messages the durable consumer `spec` has not yet delivered (its backlog)."""
        ...

    async def key_value(self, bucket: str) -> KeyValue:
        """A bucket created by `ensure_topology`."""
        ...

    def history(
        self, stream: str, *, filter_subjects: tuple[str, ...] = (), start_sequence: int = 1
    ) -> AsyncIterator[StoredMessage]:
        """Every stored message from `start_sequence` up to the stream's end when called."""
        ...

    async def close(self) -> None:
        """Flush pending publishes and close; further use fails."""
        ...
