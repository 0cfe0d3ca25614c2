"""Accounting in the job record: first start, end, and GPU-seconds per generation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gfair.events.envelope import Envelope
from gfair.events.jobs import (
    JobCompleted,
    JobEvent,
    JobMigrated,
    JobPlaced,
    JobResumed,
    JobStarted,
    JobSuspended,
)
from gfair.events.reasons import MigrationReason, SuspendReason
from gfair.events.states import JobState
from gfair.events.submission import JobSubmitted
from gfair.state.job_record import JobRecord

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
USER, JOB = "alice", "resnet-1"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def submitted(gpus: int) -> JobRecord:
    data = JobSubmitted(user=USER, job_id=JOB, gpus=gpus, command=("python", "train.py"))
    return JobRecord.accepted(Envelope.wrap(data, source="test", time=T0), data)


def fold(record: JobRecord, seconds: float, event: JobEvent) -> JobRecord:
    updated = record.apply(Envelope.wrap(event, source="test", time=at(seconds)), event)
    assert updated is not None
    return updated


def placed(generation: str, *servers: str) -> JobPlaced:
    return JobPlaced(user=USER, job_id=JOB, generation=generation, servers=servers)


def started(node: str) -> JobStarted:
    return JobStarted(user=USER, job_id=JOB, node_id=node, gpu_indices=(0, 1), attempt=1)


def resumed(node: str) -> JobResumed:
    return JobResumed(user=USER, job_id=JOB, node_id=node, gpu_indices=(0, 1), attempt=1)


def suspended(node: str) -> JobSuspended:
    return JobSuspended(
        user=USER, job_id=JOB, node_id=node, attempt=1, reason=SuspendReason.TIME_SLICE
    )


def test_time_slices_are_charged_per_generation_and_the_end_is_kept() -> None:
    record = fold(submitted(2), 5, placed("v100", "v100-0"))
    assert record.accounting.started_at is None and record.ended_at is None
    record = fold(record, 10, started("v100-0"))
    record = fold(record, 70, suspended("v100-0"))  # 60 s x 2 GPUs on v100
    record = fold(record, 100, resumed("v100-0"))
    assert record.gpu_seconds(now=at(130)) == {"v100": 120 + 60}  # the open interval too
    # Moved to a K80 server: placement re-places before the executor confirms the release.
    record = fold(record, 160, placed("k80", "k80-0"))
    record = fold(
        record,
        161,
        JobMigrated(
            user=USER,
            job_id=JOB,
            from_node="v100-0",
            to_node="k80-0",
            reason=MigrationReason.LOAD_BALANCE,
            attempt=1,
        ),
    )
    record = fold(record, 200, resumed("k80-0"))
    record = fold(record, 250, JobCompleted(user=USER, job_id=JOB, attempt=1))
    assert record.state is JobState.COMPLETED
    assert record.accounting.started_at == at(10)
    assert record.ended_at == at(250)
    # v100: 60 s + 61 s, k80: 50 s; two GPUs each time. Later reads charge nothing more.
    assert record.gpu_seconds(now=at(10_000)) == {"v100": 2 * 121, "k80": 2 * 50}


def test_a_job_cancelled_while_running_is_charged_up_to_its_end() -> None:
    record = fold(submitted(1), 1, placed("v100", "v100-0"))
    record = fold(record, 10, started("v100-0"))
    # Placement writes the cancellation itself, not through `apply`.
    record = record.model_copy(update={"state": JobState.CANCELLED, "updated_at": at(40)})
    assert record.ended_at == at(40)
    assert record.gpu_seconds(now=at(1_000)) == {"v100": 30}


def test_a_lost_node_closes_the_interval() -> None:
    record = fold(submitted(4), 1, placed("k80", "k80-0"))
    record = fold(record, 10, started("k80-0"))
    record = record.lost_node("k80-0", at(25))
    assert record.state is JobState.PLACED
    assert record.accounting.running_since is None
    assert record.gpu_seconds(now=at(500)) == {"k80": 4 * 15}


def test_a_gang_runs_until_its_last_part_stops() -> None:
    record = fold(submitted(2), 1, placed("v100", "v100-0", "v100-1"))
    record = fold(record, 10, started("v100-0"))
    record = fold(record, 11, started("v100-1"))
    record = fold(record, 40, suspended("v100-0"))
    assert record.state is JobState.RUNNING
    record = fold(record, 50, suspended("v100-1"))
    assert record.gpu_seconds(now=at(99)) == {"v100": 2 * 40}


def test_the_record_round_trips_with_its_accounting() -> None:
    record = fold(fold(submitted(1), 1, placed("v100", "v100-0")), 2, started("v100-0"))
    again = JobRecord.from_bytes(record.to_bytes())  # ended_at is written, and ignored back
    assert again == record
    assert again.gpu_seconds(now=at(12)) == pytest.approx({"v100": 10.0})
