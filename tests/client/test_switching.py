from __future__ import annotations

from datetime import UTC, datetime

from gfair.bus.history import HistoricalEvent
from gfair.client.switching import SwitchStats, describe_charges, describe_estimate
from gfair.events.envelope import Envelope, EventData
from gfair.events.jobs import JobProgress, JobResumed, JobSuspended
from gfair.events.reasons import SuspendReason
from gfair.state.profile_record import SwitchEstimate

COMMON = {"user": "alice", "job_id": "train", "node_id": "n1", "attempt": 1}


def history(*events: EventData) -> list[HistoricalEvent]:
    return [
        HistoricalEvent("GFAIR_JOBS", seq, Envelope.wrap(data, source="test"), data)
        for seq, data in enumerate(events, 1)
    ]


def test_switch_costs_come_from_the_jobs_own_reports() -> None:
    events = history(
        JobProgress(
            **COMMON, generation="v100", minibatches_per_s=5.0, iterations=10, first_step_s=2.5
        ),
        JobSuspended(**COMMON, reason=SuspendReason.TIME_SLICE, duration_s=0.01, in_place=True),
        JobResumed(**COMMON, gpu_indices=(0,), duration_s=0.004, in_place=True),
        JobSuspended(**COMMON, reason=SuspendReason.TIME_SLICE, duration_s=0.03, in_place=True),
        JobResumed(**COMMON, gpu_indices=(0,), duration_s=0.006, in_place=True),
        JobSuspended(
            **COMMON, reason=SuspendReason.MIGRATION, duration_s=0.8, checkpoint_bytes=2_000_000
        ),
        JobResumed(**COMMON, gpu_indices=(1,), duration_s=0.02),  # a new process: not in place
    )
    costs = SwitchStats.of(events)
    assert (costs.suspends, costs.in_place) == (3, 2)
    assert costs.yield_p50_s == 0.03
    assert costs.resume_in_place_p50_s == 0.005
    assert costs.cold_start_p50_s == 2.5
    assert costs.checkpoint_bytes == 2_000_000
    assert "3 suspends (2 in place)" in costs.describe()


def test_a_job_never_switched_has_nothing_to_say() -> None:
    costs = SwitchStats.of([])
    assert costs.suspends == 0 and costs.yield_p50_s is None
    assert costs.describe() == "0 suspends (0 in place)"


def test_the_schedulers_charges_follow_the_profilers_estimates() -> None:
    at = datetime(2026, 11, 26, tzinfo=UTC)
    estimate = SwitchEstimate(
        reports=7, yield_s=0.5, resume_in_place_s=0.1, cold_start_s=20.0, at=at
    )
    assert describe_estimate(estimate) == (
        "yield 0.500s, in-place resume 0.100s, cold start 20.00s (from 7 reports)"
    )
    assert describe_charges(estimate) == (
        "resume 0.60s in place, 20.50s from its checkpoint; "
        "move 20.50s, or GFAIR_MIGRATION_COST_S if that is more"
    )
    no_cold_start = SwitchEstimate(reports=2, yield_s=0.5, resume_in_place_s=0.1, at=at)
    assert describe_charges(no_cold_start) == (
        "resume 0.60s in place; move the operator's cost until a cold start is measured"
    )
    only_started = SwitchEstimate(reports=1, cold_start_s=20.0, at=at)
    assert describe_charges(only_started) == "the operator's costs until a suspend is measured"
