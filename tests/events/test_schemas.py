"""The JSON Schemas in schemas/ are generated from the models and agree with them."""

from __future__ import annotations

import argparse
import functools
import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gfair.cli import schemas as schemas_cli
from gfair.events import Envelope, EventData, decode
from gfair.events.examples import EXAMPLES, example_envelope
from gfair.events.schema import (
    Drift,
    SchemaDrift,
    check,
    event_file,
    expected_files,
    render,
    write,
)

from .conftest import CONTRACT, SCHEMAS_DIR
from .strategies import for_model


@functools.cache
def _validator(event_type: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS_DIR / event_file(event_type)).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def _wire(envelope: Envelope) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(envelope.model_dump_json())
    return document


def test_committed_schemas_match_the_models() -> None:
    assert check(SCHEMAS_DIR) == [], "run `gfair schemas` and commit the result"


def test_every_contract_type_has_a_schema_listed_in_the_index() -> None:
    index = json.loads((SCHEMAS_DIR / "index.json").read_text())
    assert set(index["events"]) == set(CONTRACT)
    for event_type, model in CONTRACT.items():
        entry = index["events"][event_type]
        assert (SCHEMAS_DIR / entry["schema"]).is_file()
        assert entry["subject"] == model.subject_pattern()
    assert (SCHEMAS_DIR / index["envelope"]).is_file()
    assert index["streams"]["GFAIR_JOBS"] == ["gfair.submit.*", "gfair.cancel.*", "gfair.job.>"]


def test_generation_is_deterministic_and_canonical() -> None:
    first, second = expected_files(), expected_files()
    assert first == second
    for content in first.values():
        assert content.endswith("}\n")
        assert render(json.loads(content)) == content


@pytest.mark.parametrize("event_type", list(CONTRACT))
def test_schema_accepts_the_example_and_rejects_a_broken_one(event_type: str) -> None:
    validator = _validator(event_type)
    message = _wire(example_envelope(EXAMPLES[event_type]))
    validator.validate(message)
    assert json.loads((SCHEMAS_DIR / event_file(event_type)).read_text())["examples"] == [message]

    wrong_type = {**message, "type": "gfair.job.other.v1"}
    assert not validator.is_valid(wrong_type)
    no_id = {k: v for k, v in message.items() if k != "id"}
    assert not validator.is_valid(no_id)
    required = json.loads((SCHEMAS_DIR / event_file(event_type)).read_text())["$defs"][
        CONTRACT[event_type].__name__
    ].get("required", [])
    for field in required:
        data = {k: v for k, v in message["data"].items() if k != field}
        assert not validator.is_valid({**message, "data": data}), field


def test_schema_and_model_agree_on_constraints() -> None:
    validator = _validator("gfair.job.submitted.v1")
    message = _wire(example_envelope(EXAMPLES["gfair.job.submitted.v1"]))
    broken = [
        {"gpus": 0},
        {"user": "a.b"},
        {"command": []},
        {"tickets": 0},
        {"env": {"1BAD": "x"}},
        {"working_dir": "relative/dir"},
    ]
    for change in broken:
        errors = list(validator.iter_errors({**message, "data": {**message["data"], **change}}))
        assert errors, change
        (field,) = change
        assert any(field in e.json_path for e in errors), (change, [e.json_path for e in errors])


@pytest.mark.parametrize("model", list(CONTRACT.values()), ids=list(CONTRACT))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_schema_accepts_every_valid_payload(model: type[EventData], data: st.DataObject) -> None:
    payload = data.draw(for_model(model), label="payload")
    _validator(model.EVENT_TYPE).validate(_wire(Envelope.wrap(payload, source="hypothesis")))


def test_envelope_schema_describes_every_message() -> None:
    schema = json.loads((SCHEMAS_DIR / "envelope.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    for example in EXAMPLES.values():
        validator.validate(_wire(example_envelope(example)))
    assert set(schema["required"]) >= {"id", "time", "type", "source", "subject", "data"}


# --- drift detection on a temporary copy --------------------------------------------------------


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    target = tmp_path / "schemas"
    shutil.copytree(SCHEMAS_DIR, target)
    # Another engineer's hand-written schema lives beside the generated ones.
    (target / "report.schema.json").write_text('{"title": "simulator report"}\n')
    return target


def test_check_reports_missing_differing_and_stale_files(copy: Path) -> None:
    assert check(copy) == []
    (copy / event_file("gfair.job.started.v1")).unlink()
    differs = copy / event_file("gfair.node.heartbeat.v1")
    differs.write_text(differs.read_text().replace('"minimum": 0', '"minimum": 1', 1))
    (copy / "index.json").write_text("{}\n")
    (copy / event_file("gfair.job.teleported.v1")).write_text("{}\n")

    assert check(copy) == [
        SchemaDrift("events/gfair.job.started.v1.json", Drift.MISSING),
        SchemaDrift("events/gfair.job.teleported.v1.json", Drift.STALE),
        SchemaDrift("events/gfair.node.heartbeat.v1.json", Drift.DIFFERS),
        SchemaDrift("index.json", Drift.DIFFERS),
    ]

    changed = write(copy)
    assert len(changed) == 4
    assert check(copy) == []
    assert not (copy / event_file("gfair.job.teleported.v1")).exists()
    assert (copy / "report.schema.json").read_text() == '{"title": "simulator report"}\n'


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="gfair")
    schemas_cli.register(parser.add_subparsers())
    args = parser.parse_args(["schemas", *argv])
    code: int = args.func(args)
    return code


def test_cli_check_fails_listing_drift_and_regeneration_fixes_it(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli("--check", "--dir", str(copy)) == 0
    (copy / "envelope.json").unlink()
    (copy / event_file("gfair.job.teleported.v1")).write_text("{}\n")

    assert _cli("--check", "--dir", str(copy)) == 1
    err = capsys.readouterr().err
    assert f"{copy / 'envelope.json'}: missing" in err
    assert f"{copy / event_file('gfair.job.teleported.v1')}: stale" in err
    assert "run `gfair schemas`" in err
    assert not (copy / "envelope.json").exists(), "--check must not write"

    assert _cli("--dir", str(copy)) == 0
    assert _cli("--check", "--dir", str(copy)) == 0
    assert (copy / "report.schema.json").exists()


def test_cli_writes_into_an_empty_directory(tmp_path: Path) -> None:
    assert _cli("--dir", str(tmp_path)) == 0
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.json"))
    assert written == sorted(expected_files())


def test_default_directory_is_the_repositorys() -> None:
    assert schemas_cli.default_directory() == SCHEMAS_DIR


def test_the_readme_submission_example_is_a_valid_message() -> None:
    readme = (SCHEMAS_DIR / "README.md").read_text()
    block = readme.split("```json\n", 1)[1].split("```", 1)[0]
    decoded = decode(block, subject="gfair.submit.alice")
    assert decoded.envelope.type == "gfair.job.submitted.v1"
    _validator("gfair.job.submitted.v1").validate(json.loads(block))
