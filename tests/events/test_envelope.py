from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from gfair.events import Envelope, JobAccepted, JobSubmitted
from gfair.events.errors import describe_validation_error
from gfair.events.jobs import JobLaunch


def _accepted() -> JobAccepted:
    return JobAccepted(user="alice", job_id="j1", gpus=2, launch=JobLaunch(command=("true",)))


def test_wrap_fills_id_time_and_the_subject_the_data_belongs_on() -> None:
    envelope = Envelope.wrap(_accepted(), source="placement")
    assert envelope.type == "gfair.job.accepted.v1"
    assert envelope.subject == "gfair.job.alice.j1.accepted"
    assert len(envelope.id) == 32
    assert envelope.time.tzinfo is not None
    assert Envelope.wrap(_accepted(), source="placement").id != envelope.id


def test_a_caused_event_inherits_the_correlation_id_and_names_its_cause() -> None:
    submitted = JobSubmitted(user="alice", job_id="j1", gpus=1, command=("true",))
    cause = Envelope.wrap(submitted, source="cli", correlation_id="job-alice-j1")
    effect = Envelope.wrap(_accepted(), source="placement", causation=cause)
    assert effect.correlation_id == "job-alice-j1"
    assert effect.causation_id == cause.id


_DROP = object()


def _wire(**changes: object) -> dict[str, object]:
    document = json.loads(Envelope.wrap(_accepted(), source="placement").model_dump_json())
    document.update(changes)
    return {k: v for k, v in document.items() if v is not _DROP}


@pytest.mark.parametrize("field", ["id", "time", "type", "source", "subject", "data"])
def test_a_message_missing_a_required_field_is_refused_naming_it(field: str) -> None:
    # A default id or time filled in on decode would differ on every redelivery.
    with pytest.raises(ValidationError) as caught:
        Envelope.model_validate(_wire(**{field: _DROP}))
    assert describe_validation_error(caught.value, root="") == f"{field}: Field required"


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("time", "2025-03-14T09:26:53", "timezone"),
        ("type", "gfair.job.accepted", "must look like gfair.<noun>.<verb>.v<N>"),
        ("type", "Gfair.job.accepted.v1", "must look like"),
        ("subject", "gfair.job.*.j1.accepted", "without wildcards"),
        ("subject", "gfair.job..accepted", "non-empty tokens"),
        ("subject", "gfair.job.alice j1.accepted", "whitespace"),
        ("subject", "gfair.job.alice.j1.accepted\n", "whitespace"),
        ("id", "has space", "should match pattern"),
        ("id", "x" * 129, "should match pattern"),
    ],
)
def test_malformed_envelope_fields_are_refused(field: str, value: str, fragment: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Envelope.model_validate(_wire(**{field: value}))
    reason = describe_validation_error(caught.value, root="")
    assert reason.startswith(f"{field}: ")
    assert fragment in reason


def test_unknown_envelope_fields_are_ignored() -> None:
    envelope = Envelope.model_validate(_wire(traceparent="00-abc", priority=3))
    assert "traceparent" not in envelope.model_dump()


def test_explicit_id_and_time_are_kept() -> None:
    at = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    envelope = Envelope.wrap(_accepted(), source="placement", event_id="evt-1", time=at)
    assert (envelope.id, envelope.time) == ("evt-1", at)
