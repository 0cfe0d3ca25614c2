"""The subject scheme of CONTRIBUTING.md: builders, parsers, streams, and where each event goes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gfair.events import EventData
from gfair.events.examples import EXAMPLES
from gfair.events.subjects import (
    STREAMS,
    CommandSubject,
    JobSubject,
    NodeSubject,
    SubjectError,
    cancel_subject,
    command_subject,
    dlq_subject,
    job_events_pattern,
    job_subject,
    node_commands_pattern,
    node_subject,
    parse_cancel_subject,
    parse_command_subject,
    parse_dlq_subject,
    parse_job_subject,
    parse_node_subject,
    parse_sched_subject,
    parse_submit_subject,
    run_report_subject,
    sched_subject,
    stream_for_subject,
    submit_subject,
    validate_token,
)

from .conftest import CONTRACT

tokens = st.from_regex(r"^[A-Za-z0-9_-]{1,64}$", fullmatch=True)
BAD_TOKENS = ["", "a.b", "*", ">", "a b", "alice\n", "x" * 65, "é", "a/b"]


def _matches(pattern: str, subject: str) -> bool:
    """NATS matching, written out here so the test does not trust the code under test."""
    want, have = pattern.split("."), subject.split(".")
    for index, token in enumerate(want):
        if token == ">":
            return len(have) > index
        if index >= len(have) or token not in ("*", have[index]):
            return False
    return len(have) == len(want)


def test_builders_follow_the_documented_scheme() -> None:
    assert submit_subject("alice") == "gfair.submit.alice"
    assert cancel_subject("alice") == "gfair.cancel.alice"
    assert job_subject("alice", "j-1", "started") == "gfair.job.alice.j-1.started"
    assert job_events_pattern("alice", "j-1") == "gfair.job.alice.j-1.>"
    assert job_events_pattern("alice") == "gfair.job.alice.*.>"
    assert node_subject("n_7", "heartbeat") == "gfair.node.n_7.heartbeat"
    assert command_subject("n_7", "start") == "gfair.cmd.n_7.start"
    assert node_commands_pattern("n_7") == "gfair.cmd.n_7.*"
    assert sched_subject("tick") == "gfair.sched.tick"
    assert dlq_subject("GFAIR_JOBS") == "gfair.dlq.GFAIR_JOBS"


@pytest.mark.parametrize("bad", BAD_TOKENS)
def test_a_bad_token_never_reaches_a_subject(bad: str) -> None:
    with pytest.raises(SubjectError, match="must be 1 to 64 of"):
        validate_token(bad)
    with pytest.raises(SubjectError, match="user must be"):
        submit_subject(bad)
    with pytest.raises(SubjectError, match="job id must be"):
        job_subject("alice", bad, "started")
    with pytest.raises(SubjectError, match="node id must be"):
        command_subject(bad, "start")


@given(user=tokens, job=tokens, event=tokens)
def test_parsers_invert_builders(user: str, job: str, event: str) -> None:
    assert parse_submit_subject(submit_subject(user)) == user
    assert parse_cancel_subject(cancel_subject(user)) == user
    assert parse_job_subject(job_subject(user, job, event)) == JobSubject(user, job, event)
    report = run_report_subject(user, job, event, job)
    assert parse_job_subject(report) == JobSubject(user, job, event, job)
    assert parse_node_subject(node_subject(job, event)) == NodeSubject(job, event)
    assert parse_command_subject(command_subject(job, event)) == CommandSubject(job, event)
    assert parse_sched_subject(sched_subject(event)) == event
    assert parse_dlq_subject(dlq_subject(user)) == user


@pytest.mark.parametrize(
    ("parser", "subject", "message"),
    [
        (parse_submit_subject, "gfair.cancel.alice", "not of the form gfair.submit.<user>"),
        (parse_submit_subject, "gfair.submit.alice.extra", "not of the form"),
        (parse_submit_subject, "gfair.submit.*", "user in subject 'gfair.submit.*' must be"),
        (parse_job_subject, "gfair.job.alice.started", "gfair.job.<user>.<job_id>.<event>"),
        (parse_job_subject, "other.job.alice.j.started", "not of the form"),
        (parse_job_subject, "gfair.job.alice.>.started", "job id in subject"),
        (parse_node_subject, "gfair.node.n1", "gfair.node.<node_id>.<event>"),
        (parse_command_subject, "gfair.node.n1.start", "gfair.cmd.<node_id>.<command>"),
        (parse_sched_subject, "gfair.sched", "gfair.sched.<event>"),
        (parse_dlq_subject, "gfair.dlq.a.b", "gfair.dlq.<stream>"),
    ],
)
def test_parsers_refuse_other_shapes(parser: object, subject: str, message: str) -> None:
    with pytest.raises(SubjectError, match=message.replace("*", r"\*").replace(".", r"\.")):
        parser(subject)  # type: ignore[operator]


def test_streams_partition_the_subject_space() -> None:
    names = [stream.name for stream in STREAMS]
    assert names == ["GFAIR_JOBS", "GFAIR_NODES", "GFAIR_COMMANDS", "GFAIR_SCHED", "GFAIR_DLQ"]
    samples = {
        "gfair.submit.alice": "GFAIR_JOBS",
        "gfair.cancel.alice": "GFAIR_JOBS",
        "gfair.job.alice.j1.started": "GFAIR_JOBS",
        "gfair.node.n1.heartbeat": "GFAIR_NODES",
        "gfair.cmd.n1.start": "GFAIR_COMMANDS",
        "gfair.sched.tick": "GFAIR_SCHED",
        "gfair.dlq.GFAIR_JOBS": "GFAIR_DLQ",
    }
    for subject, name in samples.items():
        holders = [s.name for s in STREAMS if any(_matches(p, subject) for p in s.subjects)]
        assert holders == [name], subject
        assert stream_for_subject(subject).name == name
    with pytest.raises(SubjectError, match="belongs to no gfair stream"):
        stream_for_subject("other.job.alice")


@pytest.mark.parametrize("model", list(CONTRACT.values()), ids=list(CONTRACT))
def test_each_event_goes_where_its_type_says(model: type[EventData]) -> None:
    example = EXAMPLES[model.EVENT_TYPE]
    subject, pattern = example.subject(), model.subject_pattern()
    assert _matches(pattern, subject)
    stream = stream_for_subject(pattern)
    assert any(_matches(p, subject) for p in stream.subjects)
    # No other event type's pattern captures this subject: the subject alone routes it.
    others = [
        m for m in CONTRACT.values() if m is not model and _matches(m.subject_pattern(), subject)
    ]
    assert others == []


def test_subject_tokens_of_job_events_carry_user_and_job() -> None:
    started = EXAMPLES["gfair.job.started.v1"]
    parsed = parse_job_subject(started.subject())
    assert (parsed.user, parsed.job_id, parsed.event) == (
        "alice",
        "resnet50-sweep-3f9c2a",
        "started",
    )
