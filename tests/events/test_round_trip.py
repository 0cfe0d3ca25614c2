"""Every event type survives the wire: JSON in, the same JSON out."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gfair.events import Envelope, EventData, decode, decode_data, encode
from gfair.events.examples import EXAMPLES, example_envelope

from .conftest import CONTRACT
from .strategies import for_model


def _json_round_trip(envelope: Envelope) -> None:
    wire = encode(envelope)
    decoded = decode(wire, subject=envelope.subject)
    assert decoded.envelope == envelope
    assert json.loads(encode(decoded.envelope)) == json.loads(wire)
    assert decoded.data.model_dump(mode="json") == envelope.data


def test_every_contract_type_has_an_example() -> None:
    assert set(EXAMPLES) == set(CONTRACT)


def test_examples_round_trip(model: type[EventData]) -> None:
    example = EXAMPLES[model.EVENT_TYPE]
    assert type(example) is model
    envelope = example_envelope(example)
    _json_round_trip(envelope)
    assert decode_data(envelope) == example


@pytest.mark.parametrize("model", list(CONTRACT.values()), ids=list(CONTRACT))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_generated_payloads_round_trip(model: type[EventData], data: st.DataObject) -> None:
    payload = data.draw(for_model(model), label="payload")
    envelope = Envelope.wrap(payload, source="hypothesis")
    _json_round_trip(envelope)
    assert decode_data(envelope) == payload


def _with_unknown_fields(document: Any) -> Any:
    """Add a field nobody knows to every object in the document (a newer producer)."""
    if isinstance(document, dict):
        grown = {key: _with_unknown_fields(value) for key, value in document.items()}
        grown["added_in_v2"] = {"anything": [1, "two"]}
        return grown
    if isinstance(document, list):
        return [_with_unknown_fields(item) for item in document]
    return document


def test_unknown_fields_are_tolerated_and_dropped(model: type[EventData]) -> None:
    envelope = example_envelope(EXAMPLES[model.EVENT_TYPE])
    wire = json.loads(encode(envelope))
    # Dict-valued fields (env, rates, entitlements) hold data, not schema: grow only the
    # envelope, the payload and the nested models (lists of objects).
    grown = {**wire, "added_in_v2": True, "data": _grow_models(model, wire["data"])}
    decoded = decode(json.dumps(grown), subject=envelope.subject)
    assert decoded.data == EXAMPLES[model.EVENT_TYPE]
    assert decoded.data.model_dump(mode="json") == wire["data"]
    assert "added_in_v2" not in decoded.envelope.model_dump()


def _grow_models(model: type[EventData], data: dict[str, Any]) -> dict[str, Any]:
    grown: dict[str, Any] = {"added_in_v2": "ignored"}
    for key, value in data.items():
        is_model_list = isinstance(value, list) and value and isinstance(value[0], dict)
        grown[key] = _with_unknown_fields(value) if is_model_list else value
    return grown
