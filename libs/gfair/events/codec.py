"""Bytes on the wire <-> typed events, with one clear reason when a message is not a valid event."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from gfair.events.envelope import MSG_ID_HEADER, Envelope, EventData
from gfair.events.errors import InvalidEvent, describe_validation_error
from gfair.events.registry import UnknownEventType, model_for


@dataclass(frozen=True, slots=True)
class DecodedEvent:
    envelope: Envelope
    data: EventData


def encode(envelope: Envelope) -> bytes:
    return envelope.model_dump_json().encode()


def publish_headers(envelope: Envelope) -> dict[str, str]:
    """Headers every publish carries: the event id lets JetStream drop duplicates."""
    return {MSG_ID_HEADER: envelope.id}


def verify_subject(data: EventData, subject: str) -> None:
    """Raise `InvalidEvent` unless `data` belongs on `subject`.

    This is the tenant check: a payload for user bob arriving on `gfair.submit.alice` is refused,
    because alice's credentials may publish there.
    """
    expected = data.subject()
    if expected != subject:
        raise InvalidEvent(
            f"subject: {data.EVENT_TYPE} for {expected} arrived on {subject}; "
            "the payload must match the subject it is published on"
        )


def decode(raw: bytes | str, *, subject: str | None = None) -> DecodedEvent:
    """Parse and validate a message; with `subject` (where it arrived) check it belongs there.

    Raises `InvalidEvent` whose `reason` names the field path, e.g.
    `data.gpus: Input should be greater than or equal to 1`.
    """
    try:
        envelope = Envelope.model_validate_json(raw)
    except ValidationError as error:
        raise InvalidEvent(describe_validation_error(error, root="")) from error
    try:
        model = model_for(envelope.type)
    except UnknownEventType as error:
        raise InvalidEvent(f"type: {error}") from error
    try:
        data = model.model_validate(envelope.data)
    except ValidationError as error:
        raise InvalidEvent(describe_validation_error(error, root="data")) from error
    if subject is not None:
        if envelope.subject != subject:
            raise InvalidEvent(
                f"subject: envelope says {envelope.subject} but it arrived on {subject}"
            )
        verify_subject(data, subject)
    return DecodedEvent(envelope, data)
