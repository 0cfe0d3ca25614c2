"""Job ids, job references and the states the lifecycle events lead to."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gfair.events import (
    JobEvent,
    JobRef,
    JobState,
    NodeEvent,
    NodeState,
    new_job_id,
)
from gfair.events.examples import EXAMPLES

from .conftest import CONTRACT

TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")


@given(st.none() | st.text(max_size=200))
def test_new_job_ids_are_tokens(name: str | None) -> None:
    job_id = new_job_id(name)
    assert TOKEN.fullmatch(job_id)


def test_new_job_ids_keep_a_readable_name_and_differ() -> None:
    job_id = new_job_id("ResNet-50 lr=0.1")
    assert re.fullmatch(r"ResNet-50-lr-0-1-[0-9a-f]{12}", job_id)
    assert len({new_job_id("sweep") for _ in range(100)}) == 100


def _fold(event_types: list[str]) -> list[JobState]:
    states = [JobState.SUBMITTED]
    for event_type in event_types:
        event = EXAMPLES[event_type]
        assert isinstance(event, JobEvent)
        if event.JOB_STATE is not None:
            states.append(event.JOB_STATE)
    return states


def test_a_time_sliced_migrated_job_reaches_completed() -> None:
    life = [
        "gfair.job.accepted.v1",
        "gfair.job.placed.v1",
        "gfair.job.started.v1",
        "gfair.job.progress.v1",
        "gfair.job.checkpointed.v1",
        "gfair.job.suspended.v1",
        "gfair.job.resumed.v1",
        "gfair.job.migrated.v1",
        "gfair.job.started.v1",
        "gfair.job.completed.v1",
    ]
    assert _fold(life) == [
        JobState.SUBMITTED,
        JobState.QUEUED,
        JobState.PLACED,
        JobState.RUNNING,
        JobState.SUSPENDED,
        JobState.RUNNING,
        JobState.PLACED,
        JobState.RUNNING,
        JobState.COMPLETED,
    ]


def test_a_crash_is_retried_then_fails_for_good() -> None:
    life = [
        "gfair.job.accepted.v1",
        "gfair.job.placed.v1",
        "gfair.job.started.v1",
        "gfair.job.exited.v1",
        "gfair.job.retried.v1",
        "gfair.job.placed.v1",
        "gfair.job.started.v1",
        "gfair.job.exited.v1",
        "gfair.job.failed.v1",
    ]
    states = _fold(life)
    assert states[-1] is JobState.FAILED and states[-1].terminal
    assert states.count(JobState.QUEUED) == 2
    assert not any(s.terminal for s in states[:-1])


@pytest.mark.parametrize(
    ("event_type", "terminal"),
    [
        ("gfair.job.completed.v1", True),
        ("gfair.job.failed.v1", True),
        ("gfair.job.cancelled.v1", True),
        ("gfair.job.rejected.v1", True),
        ("gfair.job.retried.v1", False),
        ("gfair.job.suspended.v1", False),
    ],
)
def test_only_endings_are_terminal(event_type: str, terminal: bool) -> None:
    state = type(EXAMPLES[event_type]).JOB_STATE  # type: ignore[attr-defined]
    assert state is not None and state.terminal is terminal


def test_node_health_transitions() -> None:
    states = {
        name.split(".")[2]: model.NODE_STATE
        for name, model in CONTRACT.items()
        if issubclass(model, NodeEvent)
    }
    assert states["registered"] is NodeState.READY
    assert states["suspected"] is NodeState.SUSPECTED
    assert states["failed"] is NodeState.FAILED
    assert states["quarantined"] is NodeState.QUARANTINED
    assert states["recovered"] is states["uncordoned"] is NodeState.READY
    assert states["heartbeat"] is states["telemetry"] is None


def test_job_refs_identify_a_job_across_events() -> None:
    started, failed = EXAMPLES["gfair.job.started.v1"], EXAMPLES["gfair.job.failed.v1"]
    assert isinstance(started, JobEvent) and isinstance(failed, JobEvent)
    assert started.job == failed.job == JobRef(user="alice", job_id="resnet50-sweep-3f9c2a")
    assert len({started.job, failed.job}) == 1
    assert str(started.job) == "alice/resnet50-sweep-3f9c2a"
