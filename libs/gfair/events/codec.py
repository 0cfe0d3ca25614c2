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


def parse_envelope(raw: bytes | str) -> Envelope:
    """Parse a message body; `InvalidEvent` (naming the field) if it is not an envelope."""
    try:
        return Envelope.model_validate_json(raw)
    except ValidationError as error:
        raise InvalidEvent(describe_validation_error(error, root="")) from error


def typed_data(envelope: Envelope) -> EventData:
    """The envelope's payload as its type's model; `InvalidEvent` naming what is wrong."""
    try:
        model = model_for(envelope.type)
    except UnknownEventType as error:
        raise InvalidEvent(f"type: {error}") from error
    try:
        return model.model_validate(envelope.data)
    except ValidationError as error:
        raise InvalidEvent(describe_validation_error(error, root="data")) from error


def check_arrival(envelope: Envelope, subject: str) -> None:
    """Raise `InvalidEvent` unless the envelope names the subject it arrived on."""
    if envelope.subject != subject:
        raise InvalidEvent(f"subject: envelope says {envelope.subject} but it arrived on {subject}")


def decode(raw: bytes | str, *, subject: str | None = None) -> DecodedEvent:
    """Parse and validate a message; with `subject` (where it arrived) check it belongs there.

    Raises `InvalidEvent` whose `reason` names the field path, e.g.
    `data.gpus: Input should be greater than or equal to 1`.
    """
    envelope = parse_envelope(raw)
    data = typed_data(envelope)
    if subject is not None:
        check_arrival(envelope, subject)
        verify_subject(data, subject)
    return DecodedEvent(envelope, data)
