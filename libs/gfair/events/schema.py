"""JSON Schema of the event contract, generated from the models (docs/design.md §3.2).

The generator owns three things under the schemas directory and nothing else there:
`envelope.json`, `index.json` and `events/*.json` (one complete message schema per event type:
the envelope with `type` fixed and `data` the payload). Output is deterministic (sorted keys,
two-space indent, trailing newline) so a check can compare bytes.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from gfair.events import job_spec
from gfair.events.envelope import Envelope, EventData
from gfair.events.examples import EXAMPLES, example_envelope
from gfair.events.registry import registered_types
from gfair.events.subjects import STREAMS, stream_for_subject

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
ENVELOPE_FILE = "envelope.json"
INDEX_FILE = "index.json"
EVENTS_DIR = "events"
_CONTRACT_PACKAGE = "gfair.events."


def render(document: Mapping[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def contract_types() -> dict[str, type[EventData]]:
    """The event types this package publishes: test doubles registered elsewhere are left out."""
    return {
        name: model
        for name, model in registered_types().items()
        if model.__module__.startswith(_CONTRACT_PACKAGE)
    }


def event_file(event_type: str) -> str:
    """Path of an event type's schema, relative to the schemas directory."""
    return f"{EVENTS_DIR}/{event_type}.json"


def _close_pattern_properties(node: Any) -> None:
    """pydantic states constrained dict keys as `patternProperties`, which alone lets any other
    key through; the models reject such keys, so the schema must too."""
    if isinstance(node, dict):
        if "patternProperties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            _close_pattern_properties(value)
    elif isinstance(node, list):
        for value in node:
            _close_pattern_properties(value)


def _description(model: type[Any]) -> str:
    return inspect.cleandoc(model.__doc__ or model.__name__)


def envelope_schema() -> dict[str, Any]:
    schema = Envelope.model_json_schema()
    schema["$schema"] = JSON_SCHEMA_DIALECT
    schema["description"] = (
        "The envelope every gfair event travels in. Publish it as the message body (UTF-8 JSON) "
        "with the header Nats-Msg-Id set to `id`; `data` is validated by the schema of `type`, "
        f"listed in {INDEX_FILE}."
    )
    return schema


def message_schema(model: type[EventData]) -> dict[str, Any]:
    """A whole message of one event type: the envelope with `type` fixed and `data` typed."""
    payload = model.model_json_schema(mode="validation")
    definitions: dict[str, Any] = payload.pop("$defs", {})
    name = model.__name__
    if name in definitions:
        raise ValueError(f"{name} refers to a definition of its own name")
    definitions[name] = payload

    schema = Envelope.model_json_schema()
    properties: dict[str, Any] = schema["properties"]
    properties["type"] = {
        "const": model.EVENT_TYPE,
        "description": "Versioned event type",
        "title": "Type",
    }
    properties["data"] = {"$ref": f"#/$defs/{name}"}
    schema["required"] = sorted({*schema.get("required", ()), "type", "data"})
    schema["$defs"] = definitions
    schema["$schema"] = JSON_SCHEMA_DIALECT
    schema["title"] = model.EVENT_TYPE
    schema["description"] = _description(model)
    pattern = model.subject_pattern()
    schema["x-gfair"] = {
        "event_type": model.EVENT_TYPE,
        "subject": pattern,
        "stream": stream_for_subject(pattern).name,
    }
    example = EXAMPLES.get(model.EVENT_TYPE)
    if example is not None:
        schema["examples"] = [example_envelope(example).model_dump(mode="json")]
    _close_pattern_properties(schema)
    return schema


def _summary(model: type[EventData]) -> str:
    return _description(model).splitlines()[0]


def index_document(types: Mapping[str, type[EventData]]) -> dict[str, Any]:
    events: dict[str, Any] = {}
    for event_type, model in types.items():
        pattern = model.subject_pattern()
        events[event_type] = {
            "schema": event_file(event_type),
            "subject": pattern,
            "stream": stream_for_subject(pattern).name,
            "summary": _summary(model),
        }
    return {
        "envelope": ENVELOPE_FILE,
        "events": events,
        "streams": {stream.name: list(stream.subjects) for stream in STREAMS},
    }


def expected_files(types: Mapping[str, type[EventData]] | None = None) -> dict[str, str]:
    """Every file the generator owns, relative path -> exact content."""
    if types is None:
        types = contract_types()
    files = {
        ENVELOPE_FILE: render(envelope_schema()),
        INDEX_FILE: render(index_document(types)),
        job_spec.SCHEMA_FILE: render(job_spec.spec_schema()),
    }
    for event_type, model in types.items():
        files[event_file(event_type)] = render(message_schema(model))
    return files


class Drift(StrEnum):
    MISSING = "missing"
    DIFFERS = "differs"
    # A schema of an event type that no longer exists.
    STALE = "stale"


@dataclass(frozen=True, slots=True)
class SchemaDrift:
    path: str
    drift: Drift

    def __str__(self) -> str:
        return f"{self.path}: {self.drift}"


def _owned_files_on_disk(directory: Path) -> Iterable[str]:
    for name in (ENVELOPE_FILE, INDEX_FILE, job_spec.SCHEMA_FILE):
        if (directory / name).is_file():
            yield name
    events = directory / EVENTS_DIR
    if events.is_dir():
        for path in sorted(events.iterdir()):
            if path.is_file() and path.suffix == ".json":
                yield f"{EVENTS_DIR}/{path.name}"


def check(directory: Path, expected: Mapping[str, str] | None = None) -> list[SchemaDrift]:
    """How the generated files under `directory` differ from what the models say, sorted."""
    if expected is None:
        expected = expected_files()
    drifts = []
    for path, content in expected.items():
        target = directory / path
        if not target.is_file():
            drifts.append(SchemaDrift(path, Drift.MISSING))
        elif target.read_bytes() != content.encode():
            drifts.append(SchemaDrift(path, Drift.DIFFERS))
    drifts.extend(
        SchemaDrift(path, Drift.STALE)
        for path in _owned_files_on_disk(directory)
        if path not in expected
    )
    return sorted(drifts, key=lambda d: d.path)


def write(directory: Path, expected: Mapping[str, str] | None = None) -> list[SchemaDrift]:
    """Bring `directory` in line with the models; returns what had to change."""
    if expected is None:
        expected = expected_files()
    drifts = check(directory, expected)
    for drift in drifts:
        target = directory / drift.path
        if drift.drift is Drift.STALE:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(expected[drift.path].encode())
    return drifts
