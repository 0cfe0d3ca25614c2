from __future__ import annotations

import pytest

from gfair.bus.topology import (
    DEAD_LETTER_STREAM,
    ConsumerSpec,
    DeliverPolicy,
    StreamSpec,
    Topology,
    consumer_for,
    contract_streams,
    dead_letter_subject,
)
from gfair.events import JobCancelRequested, JobPlaced, JobSubmitted, NodeHeartbeat


def test_contract_streams_follow_the_subject_table() -> None:
    streams = {s.name: s.subjects for s in contract_streams()}
    assert set(streams) == {
        "GFAIR_JOBS",
        "GFAIR_NODES",
        "GFAIR_COMMANDS",
        "GFAIR_SCHED",
        "GFAIR_DLQ",
    }
    assert "gfair.submit.*" in streams["GFAIR_JOBS"]
    assert streams[DEAD_LETTER_STREAM] == ("gfair.dlq.>",)
    assert dead_letter_subject("GFAIR_JOBS") == "gfair.dlq.GFAIR_JOBS"


def test_consumer_for_derives_stream_and_filters_from_models() -> None:
    spec = consumer_for((JobSubmitted, JobCancelRequested), durable="placement-submit")
    assert spec.stream == "GFAIR_JOBS"
    assert spec.filter_subjects == ("gfair.cancel.*", "gfair.submit.*")
    placed = consumer_for((JobPlaced,), durable="stride-placed", max_attempts=3)
    assert placed.filter_subjects == ("gfair.job.*.*.placed",)
    assert placed.max_attempts == 3


def test_consumer_for_refuses_models_from_two_streams() -> None:
    with pytest.raises(ValueError, match="2 streams"):
        consumer_for((JobSubmitted, NodeHeartbeat), durable="mixed")


@pytest.mark.parametrize(
    "make",
    [
        lambda: StreamSpec(name="bad name", subjects=("a.>",)),
        lambda: StreamSpec(name="S", subjects=()),
        lambda: StreamSpec(name="S", subjects=("a.>.b",)),
        lambda: ConsumerSpec(stream="S", durable="d", max_attempts=0),
        lambda: ConsumerSpec(
            stream="S", durable="d", deliver_policy=DeliverPolicy.BY_START_SEQUENCE
        ),
        lambda: ConsumerSpec(stream="S", durable="d", start_sequence=4),
    ],
)
def test_bad_declarations_fail_with_a_reason(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]


def test_merge_collapses_repeats_and_refuses_conflicts() -> None:
    a = StreamSpec(name="S", subjects=("a.>",))
    merged = Topology(streams=(a,)).merge(Topology(streams=(a,)))
    assert merged.streams == (a,)
    with pytest.raises(ValueError, match="different settings"):
        Topology(streams=(a,)).merge(Topology(streams=(StreamSpec(name="S", subjects=("b.>",)),)))
    with pytest.raises(ValueError, match="twice"):
        Topology(streams=(a, a))
