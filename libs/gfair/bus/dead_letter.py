"""Poison messages, parked on `gfair.dlq.<stream>` with the reason they could not be handled.

The record is plain JSON rather than an event envelope because the original may not be one
(undecodable bytes). It carries everything needed to inspect and, once fixed, republish the
original: subject, headers, payload, where it was stored and how often it was tried.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from enum import StrEnum
from typing import Literal, Protocol

import structlog
from pydantic import BaseModel, ConfigDict, Field

from gfair.bus.topology import dead_letter_subject
from gfair.bus.tracing import inject_context
from gfair.bus.transport import Bus, Delivery, PubAck

DEAD_LETTER_REASON_HEADER = "Gfair-Dead-Letter-Reason"
# What a dead letter keeps of its original (base64 makes it a third larger): far under the
# broker's 1 MiB limit, whatever the original's size.
PAYLOAD_KEPT = 256 * 1024

_log = structlog.get_logger("gfair.bus")


class DeadLetterReason(StrEnum):
    UNDECODABLE = "undecodable"  # not a JSON envelope
    UNREADABLE_RECORD = "unreadable_record"  # a key-value record that is not what its key holds
    INVALID = "invalid"  # unknown type, or the payload fails its registered model
    REJECTED = "rejected"  # the handler raised Unprocessable
    HANDLER_FAILED = "handler_failed"  # the handler failed on its last allowed attempt
    DELIVERY_LIMIT = "delivery_limit"  # delivered more often than allowed (crash loop)
    PUBLISH_FAILED = "publish_failed"  # its outputs could not be published on the last attempt


class StoredRecord(Protocol):
    """A key-value record that could not be read (`gfair.state.buckets.UnreadableRecord`);
    its text says why."""

    bucket: str
    key: str
    revision: int
    value: bytes


class DeadLetter(BaseModel):
    model_config = ConfigDict(frozen=True)

    reason: DeadLetterReason
    error: str
    stream: str
    sequence: int
    subject: str
    consumer: str
    service: str
    num_delivered: int
    headers: dict[str, str]
    payload: str
    payload_encoding: Literal["utf-8", "base64"]
    # The original's size: `payload` keeps at most `PAYLOAD_KEPT` bytes of it, since a dead
    # letter of a message near the broker's limit would be over it (and the broker would drop
    # the connection of the service that parks it). The whole stays at `stream`/`sequence`.
    payload_bytes: int = 0
    time: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @classmethod
    def of(
        cls,
        delivery: Delivery,
        *,
        reason: DeadLetterReason,
        error: str,
        consumer: str,
        service: str,
    ) -> DeadLetter:
        payload, encoding = _payload(delivery.data)
        return cls(
            payload_bytes=len(delivery.data),
            reason=reason,
            error=error,
            stream=delivery.stream,
            sequence=delivery.stream_sequence,
            subject=delivery.subject,
            consumer=consumer,
            service=service,
            num_delivered=delivery.num_delivered,
            headers=dict(delivery.headers),
            payload=payload,
            payload_encoding=encoding,
        )

    @classmethod
    def of_record(cls, record: StoredRecord, *, service: str) -> DeadLetter:
        """A key-value record `service` could not read, kept aside before it is passed over."""
        payload, encoding = _payload(record.value)
        return cls(
            payload_bytes=len(record.value),
            reason=DeadLetterReason.UNREADABLE_RECORD,
            error=str(record),
            stream=f"KV_{record.bucket}",
            sequence=record.revision,
            subject=f"$KV.{record.bucket}.{record.key}",
            consumer="",
            service=service,
            num_delivered=0,
            headers={},
            payload=payload,
            payload_encoding=encoding,
        )

    def original_payload(self) -> bytes:
        """What was kept of the original: all of it unless it had over `PAYLOAD_KEPT` bytes
        (`payload_bytes`; the whole is in its stream at `sequence`)."""
        if self.payload_encoding == "base64":
            return base64.b64decode(self.payload)
        return self.payload.encode("utf-8")


def _payload(data: bytes) -> tuple[str, Literal["utf-8", "base64"]]:
    data = data[:PAYLOAD_KEPT]
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


async def set_aside(bus: Bus, record: StoredRecord, *, service: str) -> None:
    """Dead-letter an unreadable record and say so: whoever read it passes over it instead
    of failing on it again and again."""
    _log.error("unreadable record dead-lettered", service=service, error=str(record))
    await publish_dead_letter(bus, DeadLetter.of_record(record, service=service))


async def publish_dead_letter(bus: Bus, record: DeadLetter) -> PubAck:
    headers = {"Content-Type": "application/json", DEAD_LETTER_REASON_HEADER: record.reason.value}
    inject_context(headers)
    return await bus.publish(
        dead_letter_subject(record.stream),
        record.model_dump_json().encode(),
        headers=headers,
        # A crash between parking and acknowledging parks it again; keep one record.
        msg_id=f"dlq-{record.stream}-{record.sequence}-{record.consumer}",
    )
