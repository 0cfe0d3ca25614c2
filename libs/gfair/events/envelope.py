"""The one envelope every gfair event travels in (DESIGN 3.2).

The envelope carries identity (the id doubles as JetStream's `Nats-Msg-Id`, so duplicate
publishes are dropped), the versioned type, provenance (source, correlation and causation ids)
and the typed payload in `data`. Unknown fields are tolerated so that newer producers do not
break older consumers.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator

TYPE_PATTERN = re.compile(r"^gfair\.[a-z_]+(\.[a-z_]+)*\.v[0-9]+$")


def new_event_id() -> str:
    return uuid.uuid4().hex


def utc_now() -> datetime:
    return datetime.now(UTC)


class EventData(BaseModel):
    """Base of every event payload.

    Subclasses set `EVENT_TYPE` (for example ``"gfair.job.submitted.v1"``) and register
    themselves with `gfair.events.registry.register`.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    EVENT_TYPE: ClassVar[str] = ""


class Envelope(BaseModel):
    """A gfair event: metadata plus the payload of one registered `EventData` type."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str = Field(default_factory=new_event_id, min_length=1, max_length=128)
    type: str = Field(description="Versioned event type, e.g. gfair.job.submitted.v1")
    source: str = Field(min_length=1, max_length=256, description="Service or tool that emitted it")
    time: datetime = Field(default_factory=utc_now)
    subject: str = Field(min_length=1, max_length=512, description="NATS subject it was sent on")
    correlation_id: str | None = Field(
        default=None, description="Id shared by every event of one job's (or node's) life"
    )
    causation_id: str | None = Field(default=None, description="Id of the event that caused this")
    data: dict[str, Any] = Field(default_factory=dict)

    @field_validator("type")
    @classmethod
    def _type_is_versioned(cls, value: str) -> str:
        if not TYPE_PATTERN.match(value):
            raise ValueError(f"event type {value!r} must look like gfair.<noun>.<verb>.v<N>")
        return value

    @classmethod
    def wrap(
        cls,
        data: EventData,
        *,
        subject: str,
        source: str,
        correlation_id: str | None = None,
        causation: Envelope | None = None,
        event_id: str | None = None,
        time: datetime | None = None,
    ) -> Self:
        """Envelope `data`; a causing event passes on its correlation id and becomes the cause."""
        if correlation_id is None and causation is not None:
            correlation_id = causation.correlation_id
        fields: dict[str, Any] = {
            "type": data.EVENT_TYPE,
            "source": source,
            "subject": subject,
            "correlation_id": correlation_id,
            "causation_id": causation.id if causation is not None else None,
            "data": data.model_dump(mode="json"),
        }
        if event_id is not None:
            fields["id"] = event_id
        if time is not None:
            fields["time"] = time
        return cls(**fields)
