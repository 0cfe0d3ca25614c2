"""The GPU-holding replay the reliability tests judge runs by (job_history.gpu_overlaps)."""

from __future__ import annotations

from gfair.events.codec import DecodedEvent
from gfair.events.envelope import Envelope, EventData
from gfair.events.jobs import JobStarted, JobSuspended
from gfair.events.reasons import SuspendReason
from gfair.events.submission import JobSubmitted

from .job_history import gpu_overlaps


def _event(data: EventData) -> DecodedEvent:
    return DecodedEvent(Envelope.wrap(data, source="test"), data)


def _submitted(job_id: str, gpus: int) -> DecodedEvent:
    return _event(JobSubmitted(user="a", job_id=job_id, gpus=gpus, command=("true",)))


def _started(job_id: str, node: str, gpus: tuple[int, ...]) -> DecodedEvent:
    return _event(JobStarted(user="a", job_id=job_id, node_id=node, gpu_indices=gpus, attempt=1))


def test_two_jobs_started_on_one_gpu_overlap() -> None:
    events = [_submitted("x", 1), _submitted("y", 1), _started("x", "n1", (0,))]
    events.append(_started("y", "n1", (0,)))
    overlaps, _ = gpu_overlaps(events)
    assert [(o.node_id, o.gpu, o.holder, o.intruder) for o in overlaps] == [("n1", 0, "a/x", "a/y")]


def test_a_copy_left_on_a_failed_node_is_not_held_once_its_job_runs_elsewhere() -> None:
    # x ran on n1, n1 was declared failed, x started on n2; the copy on n1 was fenced (a kill
    # reports nothing), then y started on n1's GPU.
    events = [_submitted("x", 1), _submitted("y", 1), _started("x", "n1", (0,))]
    events += [_started("x", "n2", (0,)), _started("y", "n1", (0,))]
    assert gpu_overlaps(events)[0] == []


def test_a_gang_part_on_another_node_does_not_release_the_first() -> None:
    events = [_submitted("g", 4), _submitted("y", 1), _started("g", "n1", (0, 1))]
    events += [_started("g", "n2", (0, 1)), _started("y", "n1", (1,))]
    overlaps, _ = gpu_overlaps(events)
    assert [(o.holder, o.intruder) for o in overlaps] == [("a/g", "a/y")]
    suspended = JobSuspended(
        user="a", job_id="g", node_id="n1", attempt=1, reason=SuspendReason.TIME_SLICE
    )
    assert gpu_overlaps([*events[:4], _event(suspended), events[4]])[0] == []
