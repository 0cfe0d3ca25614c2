"""Bad payloads are refused with one reason that names the field path."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from gfair.events import (
    Envelope,
    InvalidEvent,
    JobExited,
    JobSubmitted,
    decode,
    describe_validation_error,
    encode,
)
from gfair.events.examples import EXAMPLES, example_envelope


def _message(event_type: str, **data_changes: Any) -> dict[str, Any]:
    wire: dict[str, Any] = json.loads(encode(example_envelope(EXAMPLES[event_type])))
    wire["data"].update(data_changes)
    return wire


def _reason(message: dict[str, Any]) -> str:
    with pytest.raises(InvalidEvent) as caught:
        decode(json.dumps(message))
    return caught.value.reason


SUBMITTED = "gfair.job.submitted.v1"


@pytest.mark.parametrize(
    ("event_type", "changes", "reason"),
    [
        (SUBMITTED, {"gpus": 0}, "data.gpus: Input should be greater than or equal to 1"),
        (SUBMITTED, {"gpus": 5000}, "data.gpus: Input should be less than or equal to 4096"),
        (SUBMITTED, {"gpus": "two"}, "data.gpus: Input should be a valid integer"),
        (SUBMITTED, {"user": "al.ice"}, "data.user: String should match pattern"),
        (SUBMITTED, {"user": "*"}, "data.user: String should match pattern"),
        (SUBMITTED, {"job_id": "x" * 65}, "data.job_id: String should match pattern"),
        (SUBMITTED, {"tickets": 0}, "data.tickets: Input should be greater than or equal to 0.001"),
        # A denormal weight would make the job's pass step infinite (issue 11).
        (SUBMITTED, {"tickets": 1e-310}, "data.tickets: Input should be greater than or equal"),
        (SUBMITTED, {"tickets": 1e300}, "data.tickets: Input should be less than or equal to"),
        (SUBMITTED, {"tickets": "NaN"}, "data.tickets: Input should be a finite number"),
        (SUBMITTED, {"command": []}, "data.command: Tuple should have at least 1 item"),
        (SUBMITTED, {"command": "python train.py"}, "data.command: Input should be a valid"),
        (SUBMITTED, {"command": ["", "x"]}, "data.command: the program (first item) must not"),
        (SUBMITTED, {"command": ["a", "b\x00"]}, "data.command[1]: must not contain NUL"),
        (SUBMITTED, {"command": ["a", 3]}, "data.command[1]: Input should be a valid string"),
        (SUBMITTED, {"env": {"1X": "y"}}, "data.env.1X.[key]: String should match pattern"),
        (SUBMITTED, {"working_dir": "sweep"}, "data.working_dir: must be an absolute path"),
        (SUBMITTED, {"max_retries": -1}, "data.max_retries: Input should be greater than or"),
        (
            "gfair.job.started.v1",
            {"gpu_indices": [2, 3, 2]},
            "data.gpu_indices: items must be unique; repeated: 2",
        ),
        ("gfair.job.started.v1", {"gpu_indices": [-1]}, "data.gpu_indices[0]: Input should be"),
        ("gfair.job.started.v1", {"attempt": 0}, "data.attempt: Input should be greater than"),
        (
            "gfair.job.exited.v1",
            {"exit_code": 1, "signal": 9},
            "data: exactly one of exit_code and signal must be set",
        ),
        (
            "gfair.job.exited.v1",
            {"exit_code": None},
            "data: exactly one of exit_code and signal must be set",
        ),
        ("gfair.job.exited.v1", {"exit_code": 256}, "data.exit_code: Input should be less than"),
        (
            "gfair.job.failed.v1",
            {"failure_class": "success"},
            "data: a failure cannot have failure class success",
        ),
        (
            "gfair.job.failed.v1",
            {"failure_class": "bad_luck"},
            "data.failure_class: Input should be 'success', 'user_error'",
        ),
        ("gfair.job.retried.v1", {"attempt": 1}, "data: a retry is attempt 2 or later"),
        (
            "gfair.job.cancelled.v1",
            {"previous_state": "completed"},
            "data: a completed job cannot be cancelled",
        ),
        ("gfair.job.migrated.v1", {"to_node": "gpu-node-07"}, "data: from_node and to_node"),
        ("gfair.job.placed.v1", {"servers": []}, "data.servers: Tuple should have at least 1"),
        ("gfair.job.placed.v1", {"servers": ["a", "a"]}, "data.servers: items must be unique"),
        ("gfair.job.progress.v1", {"minibatches_per_s": -1}, "data.minibatches_per_s: Input"),
        (
            "gfair.node.registered.v1",
            {
                "gpus": [
                    {
                        "index": 0,
                        "uuid": "a",
                        "name": "K80",
                        "generation": "k80",
                        "memory_bytes": 1,
                    },
                    {
                        "index": 1,
                        "uuid": "b",
                        "name": "K80",
                        "generation": "k80",
                        "memory_bytes": 0,
                    },
                ]
            },
            "data.gpus[1].memory_bytes: Input should be greater than 0",
        ),
        (
            "gfair.node.registered.v1",
            {
                "gpus": [
                    {
                        "index": 0,
                        "uuid": "a",
                        "name": "K80",
                        "generation": "k80",
                        "memory_bytes": 1,
                    },
                    {
                        "index": 0,
                        "uuid": "b",
                        "name": "K80",
                        "generation": "k80",
                        "memory_bytes": 1,
                    },
                ]
            },
            "data: GPUs must be distinct: items must be unique; repeated: 0",
        ),
        (
            "gfair.node.telemetry.v1",
            {
                "gpus": [
                    {
                        "index": 0,
                        "utilization_pct": 101,
                        "memory_used_bytes": 0,
                        "temperature_c": 40,
                    }
                ]
            },
            "data.gpus[0].utilization_pct: Input should be less than or equal to 100",
        ),
        ("gfair.cmd.migrate.v1", {"to_node": "gpu-node-07"}, "data: to_node must differ"),
        ("gfair.cmd.start.v1", {"checkpoint_dir": None}, "data.checkpoint_dir: Input should be"),
        (
            "gfair.trade.cleared.v1",
            {"price": 7.0},
            "data: price 7.0 must lie between the seller's bid 1.2 and the buyer's bid 6.0",
        ),
        ("gfair.trade.cleared.v1", {"seller": "alice"}, "data: buyer and seller must differ"),
        ("gfair.trade.cleared.v1", {"seller": "dave"}, "data: no bid from dave"),
        ("gfair.profile.updated.v1", {"baseline": "a100"}, "data: baseline 'a100' has no rate"),
        (
            "gfair.profile.updated.v1",
            {"observed": ["h100"]},
            "data: generations without a rate: h100",
        ),
        (
            "gfair.entitlements.updated.v1",
            {"entitlements": {"alice": {"v100": -1}}},
            "data.entitlements.alice.v100: Input should be greater than or equal to 0",
        ),
    ],
)
def test_invalid_payloads_name_the_field(
    event_type: str, changes: dict[str, Any], reason: str
) -> None:
    assert _reason(_message(event_type, **changes)).startswith(reason)


def test_every_problem_is_reported_in_one_reason() -> None:
    reason = _reason(_message(SUBMITTED, gpus=0, user="a b"))
    assert reason.split("; ") == [
        "data.user: String should match pattern '^[A-Za-z0-9_-]{1,64}$'",
        "data.gpus: Input should be greater than or equal to 1",
    ]


def test_missing_payload_fields_are_named() -> None:
    message = _message(SUBMITTED)
    del message["data"]["command"]
    assert _reason(message) == "data.command: Field required"


def test_describe_validation_error_formats_paths() -> None:
    with pytest.raises(ValidationError) as caught:
        JobSubmitted.model_validate({"user": "alice", "job_id": "j", "gpus": 0, "command": ["x"]})
    assert (
        describe_validation_error(caught.value)
        == "data.gpus: Input should be greater than or equal to 1"
    )
    assert describe_validation_error(caught.value, root="") == (
        "gpus: Input should be greater than or equal to 1"
    )


def test_unknown_type_and_broken_json_are_refused_clearly() -> None:
    message = _message(SUBMITTED)
    message["type"] = "gfair.job.teleported.v1"
    assert _reason(message) == "type: unknown event type 'gfair.job.teleported.v1'"
    with pytest.raises(InvalidEvent) as caught:
        decode(b"{not json")
    assert caught.value.reason.startswith("(root): Invalid JSON")


def test_a_payload_on_another_users_subject_is_refused() -> None:
    # alice's credentials may publish on gfair.submit.alice; the payload claims bob.
    bob = JobSubmitted(user="bob", job_id="j1", gpus=1, command=("true",))
    envelope = Envelope.wrap(bob, source="cli", subject="gfair.submit.alice")
    with pytest.raises(InvalidEvent) as caught:
        decode(encode(envelope), subject="gfair.submit.alice")
    assert "arrived on gfair.submit.alice" in caught.value.reason
    assert "gfair.submit.bob" in caught.value.reason


def test_a_run_report_naming_another_node_than_its_subject_is_refused() -> None:
    # node-a's credentials may publish on ...exited.node-a; the payload claims node-b's run.
    forged = JobExited(
        user="alice", job_id="j1", node_id="node-b", attempt=1, exit_code=1, runtime_s=5.0
    )
    subject = "gfair.job.alice.j1.exited.node-a"
    envelope = Envelope.wrap(forged, source="node-a", subject=subject)
    with pytest.raises(InvalidEvent) as caught:
        decode(encode(envelope), subject=subject)
    assert "gfair.job.alice.j1.exited.node-b arrived on " + subject in caught.value.reason


def test_an_envelope_claiming_another_subject_is_refused() -> None:
    envelope = example_envelope(EXAMPLES[SUBMITTED])
    with pytest.raises(InvalidEvent) as caught:
        decode(encode(envelope), subject="gfair.submit.mallory")
    assert caught.value.reason == (
        "subject: envelope says gfair.submit.alice but it arrived on gfair.submit.mallory"
    )


def test_generations_are_stored_lower_case() -> None:
    message = _message("gfair.job.placed.v1", generation="V100")
    assert decode(json.dumps(message)).data.model_dump()["generation"] == "v100"


def test_payloads_are_immutable() -> None:
    submitted = EXAMPLES[SUBMITTED]
    with pytest.raises(ValidationError):
        submitted.gpus = 3  # type: ignore[misc]
