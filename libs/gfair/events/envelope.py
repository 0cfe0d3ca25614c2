"""The one envelope every gfair event travels in (docs/design.md §3.2).

The envelope carries identity (the id doubles as JetStream's `Nats-Msg-Id`, so duplicate
publishes are dropped), the versioned type, provenance (source, correlation and causation ids)
and the typed payload in `data`. Unknown fields are tolerated so that newer producers do not
break older consumers.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar, Self, TypeAlias

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

TYPE_PATTERN = re.compile(r"^gfair\.[a-z_]+(\.[a-z_]+)*\.v[0-9]+$")
# The id travels as the Nats-Msg-Id header: printable ASCII without spaces survives any header.
ID_REGEX = r"^[!-~]{1,128}$"
# JetStream drops a publish whose Nats-Msg-Id it has seen within the stream's duplicate window.
MSG_ID_HEADER = "Nats-Msg-Id"
# A concrete subject: non-empty dot-separated tokens, no wildcards, no whitespace.
SUBJECT_PATTERN = re.compile(r"^[^.*>\s]+(\.[^.*>\s]+)*$")


def new_event_id() -> str:
    return uuid.uuid4().hex


# What services read the time from: `utc_now`, or a test's hand-driven clock.
Clock: TypeAlias = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class EventData(BaseModel):
    """Base of every event payload.

    Subclasses set `EVENT_TYPE` (for example ``"gfair.job.submitted.v1"``) and register
    themselves with `gfair.events.registry.register`.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    EVENT_TYPE: ClassVar[str] = ""

    def subject(self) -> str:
        """The NATS subject this event is published on, built from its own fields."""
        raise NotImplementedError(f"{type(self).__name__} does not say where it is published")

    @classmethod
    def subject_pattern(cls) -> str:
        """The wildcard pattern covering every subject events of this type are published on."""
        raise NotImplementedError(f"{cls.__name__} does not say where it is published")


class Envelope(BaseModel):
    """A gfair event: metadata plus the payload of one registered `EventData` type."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    # id and time are required on the wire: a default filled in on decode would give every
    # redelivery a new id and time, defeating dedup and idempotent handling (docs/design.md §3.2).
    # `wrap` fills them for producers.
    id: str = Field(
        pattern=ID_REGEX,
        description="Unique event id; also the Nats-Msg-Id header, so JetStream drops repeats",
    )
    type: str = Field(
        description="Versioned event type, e.g. gfair.job.submitted.v1",
        json_schema_extra={"pattern": TYPE_PATTERN.pattern},
    )
    source: str = Field(min_length=1, max_length=256, description="Service or tool that emitted it")
    time: AwareDatetime = Field(description="When it happened (RFC 3339, with a time zone)")
    subject: str = Field(
        min_length=1,
        max_length=512,
        description="NATS subject it was published on",
        json_schema_extra={"pattern": SUBJECT_PATTERN.pattern},
    )
    correlation_id: str | None = Field(
        default=None,
        max_length=128,
        description="Id shared by every event of one job's (or node's) life",
    )
    causation_id: str | None = Field(
        default=None, max_length=128, description="Id of the event that caused this"
    )
    data: dict[str, Any] = Field(description="The payload; its schema is the one of `type`")

    @field_validator("type")
    @classmethod
    def _type_is_versioned(cls, value: str) -> str:
        if not TYPE_PATTERN.fullmatch(value):
            raise ValueError(f"event type {value!r} must look like gfair.<noun>.<verb>.v<N>")
        return value

    @field_validator("subject")
    @classmethod
    def _subject_is_concrete(cls, value: str) -> str:
        if not SUBJECT_PATTERN.fullmatch(value):
            raise ValueError(
                f"subject {value!r} must be dot-separated non-empty tokens without "
                "wildcards or whitespace"
            )
        return value

    @classmethod
    def wrap(
        cls,
        data: EventData,
        *,
        source: str,
        subject: str | None = None,
        correlation_id: str | None = None,
        causation: Envelope | None = None,
        event_id: str | None = None,
        time: datetime | None = None,
    ) -> Self:
        """Envelope `data`; a causing event passes on its correlation id and becomes the cause.

        `subject` defaults to the one `data` is published on.
        """
        if correlation_id is None and causation is not None:
            correlation_id = causation.correlation_id
        fields: dict[str, Any] = {
            "id": new_event_id() if event_id is None else event_id,
            "time": utc_now() if time is None else time,
            "type": data.EVENT_TYPE,
            "source": source,
            "subject": data.subject() if subject is None else subject,
            "correlation_id": correlation_id,
            "causation_id": causation.id if causation is not None else None,
            "data": data.model_dump(mode="json"),
        }
        return cls(**fields)
