"""Test-only event types (`gfair.test.*.v1`) on `bustest.*` subjects, and their stream."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from gfair.bus.topology import StreamSpec
from gfair.events.envelope import EventData
from gfair.events.registry import register

STREAM = "BUSTEST"
TEST_STREAM = StreamSpec(name=STREAM, subjects=("bustest.>",), duplicate_window_s=60.0)


class _TestEvent(EventData):
    VERB: ClassVar[str] = ""

    key: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")

    def subject(self) -> str:
        return f"bustest.{self.VERB}.{self.key}"

    @classmethod
    def subject_pattern(cls) -> str:
        return f"bustest.{cls.VERB}.*"


@register
class Pinged(_TestEvent):
    EVENT_TYPE = "gfair.test.pinged.v1"
    VERB = "ping"

    count: int = Field(default=0, ge=0)


@register
class Ponged(_TestEvent):
    EVENT_TYPE = "gfair.test.ponged.v1"
    VERB = "pong"

    count: int = 0


@register
class Noted(_TestEvent):
    EVENT_TYPE = "gfair.test.noted.v1"
    VERB = "note"
