"""Hypothesis strategies for what a careless or hostile publisher can put on the bus.

Valid events of every registered type (from the models' own annotations, `events.strategies`)
and mutations of them: a field dropped, a field of the wrong JSON type, huge values, tokens that
are not subject tokens, a payload for another user than its subject's, broken envelopes, and
raw bytes. What the services must make of each is decided by the test, by validating the
input the way the contract says (`gfair.events.codec.decode`), not by these strategies.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st

from events.strategies import for_model
from gfair.events.envelope import EventData
from gfair.events.registry import registered_types
from gfair.events.subjects import SubjectError, stream_for_subject, submit_subject
from gfair.events.submission import JobSubmitted

USERS = ("alice", "bob")

# Every registered type of the contract (test-only types that other suites register in the
# same process live on their own subjects, outside every gfair stream).
CONTRACT_TYPES: tuple[type[EventData], ...] = tuple(
    model for model in registered_types().values() if model.__module__.startswith("gfair.events")
)

BAD_TOKENS = (
    "",
    "a.b",
    "*",
    ">",
    "a b",
    "x" * 65,
    "ünïcode",
    "nul\x00byte",
    "gfair.submit.bob",
    "../../etc",
)
WRONG_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=16),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
HUGE_VALUES = st.sampled_from(
    [10**18, -(10**18), 2**64, 1e308, -1e308, "x" * 200_000, ["a"] * 5_000, {"k": "v" * 150_000}]
)


@dataclass(frozen=True, slots=True)
class Input:
    """Bytes to publish on a subject, and how they were made (for the failure report)."""

    subject: str
    payload: bytes
    how: str


def envelope_dict(data: dict[str, Any], event_type: str, subject: str) -> dict[str, Any]:
    return {
        "id": uuid.uuid4().hex,
        "type": event_type,
        "source": "fuzzer",
        "time": datetime.now(UTC).isoformat(),
        "subject": subject,
        "data": data,
    }


def _encode(body: object) -> bytes:
    # allow_nan: Python writes NaN and Infinity, which strict JSON parsers refuse; so be it.
    return json.dumps(body, allow_nan=True).encode()


@st.composite
def mutated(
    draw: st.DrawFn, data: dict[str, Any], token_fields: tuple[str, ...]
) -> tuple[dict[str, Any], str]:
    """`data` with one thing wrong, and what."""
    keys = sorted(data)
    kinds = ["wrong type", "huge", "extra garbage"]
    if keys:
        kinds.append("missing")
    tokens = [k for k in token_fields if k in data]
    if tokens:
        kinds.append("bad token")
    kind = draw(st.sampled_from(kinds))
    changed = dict(data)
    if kind == "missing":
        key = draw(st.sampled_from(keys))
        del changed[key]
        return changed, f"missing {key}"
    if kind == "bad token":
        key = draw(st.sampled_from(tokens))
        changed[key] = draw(st.sampled_from(BAD_TOKENS))
        return changed, f"bad token {key}={changed[key]!r:.40}"
    if kind == "extra garbage":
        # Unknown fields are ignored by contract: this one may well stay valid.
        changed[draw(st.text(min_size=1, max_size=8))] = draw(WRONG_VALUES)
        return changed, "extra field"
    key = draw(st.sampled_from(keys)) if keys else "gpus"
    changed[key] = draw(WRONG_VALUES if kind == "wrong type" else HUGE_VALUES)
    return changed, f"{kind} {key}"


@st.composite
def broken_envelope(draw: st.DrawFn, envelope: dict[str, Any]) -> tuple[dict[str, Any], str]:
    field = draw(st.sampled_from(["id", "type", "time", "subject", "data", "source"]))
    changed = dict(envelope)
    choice = draw(st.integers(0, 2))
    if choice == 0:
        del changed[field]
        return changed, f"envelope without {field}"
    replacements: dict[str, list[object]] = {
        "id": ["", "has space", "x" * 200],
        "type": ["gfair.job.nope.v1", "not-a-type", "gfair.job.submitted"],
        "time": ["yesterday", "2024-01-01T00:00:00", 12],
        "subject": ["gfair.submit.*", "gfair..x", "other.subject"],
        "data": [[], "text", None],
        "source": ["", "s" * 300],
    }
    changed[field] = draw(st.sampled_from(replacements[field]))
    return changed, f"envelope {field}={changed[field]!r:.30}"


@st.composite
def submissions(draw: st.DrawFn) -> Input:
    """What may arrive on `gfair.submit.<user>`: mostly bad, some valid, some over the limits."""
    user = draw(st.sampled_from(USERS))
    subject = submit_subject(user)
    kind = draw(
        st.sampled_from(
            ["bytes", "json", "mutated", "forged", "envelope", "other type", "over limits", "valid"]
        )
    )
    if kind == "bytes":
        return Input(subject, draw(st.binary(max_size=512)), "raw bytes")
    if kind == "json":
        value = draw(
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                lambda inner: (
                    st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=3)
                ),
                max_leaves=8,
            )
        )
        return Input(subject, _encode(value), "json that is no envelope")
    base: JobSubmitted = draw(for_model(JobSubmitted))
    data = base.model_dump(mode="json") | {"user": user}
    if kind == "valid":
        return Input(subject, _encode(envelope_dict(data, base.EVENT_TYPE, subject)), "valid")
    if kind == "over limits":
        # A fresh id: an id in use would be refused as a duplicate before the limits are read.
        data["job_id"] = f"limit-{uuid.uuid4().hex}"
        data |= draw(
            st.sampled_from([{"gpus": 4000}, {"tickets": 1e9}, {"command": ["x" * 100_000] * 2}])
        )
        return Input(subject, _encode(envelope_dict(data, base.EVENT_TYPE, subject)), "limits")
    if kind == "forged":
        data["user"] = next(u for u in USERS if u != user)
        return Input(subject, _encode(envelope_dict(data, base.EVENT_TYPE, subject)), "forged")
    if kind == "other type":
        model = draw(st.sampled_from([m for m in CONTRACT_TYPES if m is not JobSubmitted]))
        other: EventData = draw(for_model(model))
        payload = other.model_dump(mode="json")
        return Input(
            subject, _encode(envelope_dict(payload, model.EVENT_TYPE, subject)), model.__name__
        )
    if kind == "envelope":
        body, how = draw(broken_envelope(envelope_dict(data, base.EVENT_TYPE, subject)))
        return Input(subject, _encode(body), how)
    changed, how = draw(mutated(data, ("user", "job_id")))
    return Input(subject, _encode(envelope_dict(changed, base.EVENT_TYPE, subject)), how)


@st.composite
def any_events(draw: st.DrawFn) -> Input:
    """An event of any contract type, valid or mutated, on its subject or a wrong one."""
    model = draw(st.sampled_from(CONTRACT_TYPES))
    instance: EventData = draw(for_model(model))
    subject = instance.subject()
    data = instance.model_dump(mode="json")
    kind = draw(st.sampled_from(["valid", "mutated", "wrong subject", "envelope"]))
    if kind == "valid":
        return Input(subject, _encode(envelope_dict(data, model.EVENT_TYPE, subject)), "valid")
    if kind == "wrong subject":
        other: EventData = draw(for_model(draw(st.sampled_from(CONTRACT_TYPES))))
        target = other.subject()
        body = envelope_dict(data, model.EVENT_TYPE, target)
        return Input(target, _encode(body), f"{model.__name__} on {target}")
    if kind == "envelope":
        body, how = draw(broken_envelope(envelope_dict(data, model.EVENT_TYPE, subject)))
        return Input(subject, _encode(body), f"{model.__name__}: {how}")
    tokens = tuple(name for name in data if name in ("user", "job_id", "node_id"))
    changed, how = draw(mutated(data, tokens))
    body = envelope_dict(changed, model.EVENT_TYPE, subject)
    return Input(subject, _encode(body), f"{model.__name__}: {how}")


def stored_on_a_stream(subject: str) -> bool:
    try:
        stream_for_subject(subject)
    except SubjectError:
        return False
    return True
