"""Reading a stream's history as typed events, to rebuild a service's view on start."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass

import structlog

from gfair.bus.transport import Bus
from gfair.bus.wire import server_timed, validated_data
from gfair.events.codec import parse_envelope
from gfair.events.envelope import Envelope, EventData
from gfair.events.errors import InvalidEvent

_log = structlog.get_logger("gfair.bus.history")


@dataclass(frozen=True, slots=True)
class HistoricalEvent:
    stream: str
    sequence: int
    envelope: Envelope
    data: EventData


async def read_history(
    bus: Bus,
    stream: str,
    *,
    filter_subjects: tuple[str, ...] = (),
    start_sequence: int = 1,
    accepts: tuple[type[EventData], ...] = (),
) -> AsyncGenerator[HistoricalEvent, None]:
    """Every decodable event stored so far, oldest first; `accepts` narrows the types.

    Undecodable or invalid messages are skipped with a warning: the live consumers have
    dead-lettered them already, and one bad message must not keep a service from starting.
    """
    wanted = frozenset(model.EVENT_TYPE for model in accepts)
    async for message in bus.history(
        stream, filter_subjects=filter_subjects, start_sequence=start_sequence
    ):
        try:
            envelope = server_timed(
                parse_envelope(message.data), message.subject, message.stored_at
            )
            if wanted and envelope.type not in wanted:
                continue
            data = validated_data(envelope, message.subject)
        except InvalidEvent as exc:
            _log.warning(
                "skipping unreadable message in history",
                stream=stream,
                sequence=message.sequence,
                subject=message.subject,
                error=exc.reason,
            )
            continue
        yield HistoricalEvent(stream, message.sequence, envelope, data)
