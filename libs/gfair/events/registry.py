"""Registry of event types: versioned type name -> payload model."""

from __future__ import annotations

from typing import TypeVar

from gfair.events.envelope import Envelope, EventData

E = TypeVar("E", bound=type[EventData])

_TYPES: dict[str, type[EventData]] = {}


class UnknownEventType(LookupError):
    """An envelope names a type no model is registered for."""


def register(model: E) -> E:
    """Class decorator: make `model` decodable by its `EVENT_TYPE`."""
    name = model.EVENT_TYPE
    if not name:
        raise ValueError(f"{model.__name__} has no EVENT_TYPE")
    existing = _TYPES.get(name)
    if existing is not None and existing is not model:
        raise ValueError(f"event type {name} registered twice ({existing.__name__})")
    _TYPES[name] = model
    return model


def model_for(event_type: str) -> type[EventData]:
    try:
        return _TYPES[event_type]
    except KeyError:
        raise UnknownEventType(f"unknown event type {event_type!r}") from None


def registered_types() -> dict[str, type[EventData]]:
    return dict(sorted(_TYPES.items()))


def decode_data(envelope: Envelope) -> EventData:
    """Validate the payload of `envelope` against its registered model.

    Raises `UnknownEventType` or `pydantic.ValidationError` (whose errors carry field paths).
    """
    return model_for(envelope.type).model_validate(envelope.data)
