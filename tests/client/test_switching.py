from __future__ import annotations

from gfair.bus.history import HistoricalEvent
from gfair.client.switching import SwitchCosts
from gfair.events.envelope import Envelope, EventData
from gfair.events.jobs import JobProgress, JobResumed, JobSuspended
from gfair.events.reasons import SuspendReason

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
    costs = SwitchCosts.of(events)
    assert (costs.suspends, costs.in_place) == (3, 2)
    assert costs.yield_p50_s == 0.03
    assert costs.resume_in_place_p50_s == 0.005
    assert costs.cold_start_p50_s == 2.5
    assert costs.checkpoint_bytes == 2_000_000
    assert "3 suspends (2 in place)" in costs.describe()


def test_a_job_never_switched_has_nothing_to_say() -> None:
    costs = SwitchCosts.of([])
    assert costs.suspends == 0 and costs.yield_p50_s is None
    assert costs.describe() == "0 suspends (0 in place)"
