"""The replay the live tests judge by: it must see an overlap or a lost job when there is one."""

from __future__ import annotations

from gfair.client.job_history import Outcomes, gpu_overlaps, most_nodes_at_once
from gfair.events.codec import DecodedEvent
from gfair.events.envelope import Envelope, EventData
from gfair.events.jobs import (
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobMigrated,
    JobResumed,
    JobStarted,
    JobSuspended,
)
from gfair.events.reasons import FailureClass, MigrationReason, SuspendReason
from gfair.events.states import JobState
from gfair.events.submission import JobSubmitted


def events(*payloads: EventData) -> list[DecodedEvent]:
    return [DecodedEvent(Envelope.wrap(p, source="test"), p) for p in payloads]


def started(job: str, node: str, *gpus: int) -> JobStarted:
    return JobStarted(user="u", job_id=job, node_id=node, gpu_indices=gpus, attempt=1)


def suspended(job: str, node: str) -> JobSuspended:
    return JobSuspended(
        user="u", job_id=job, node_id=node, attempt=1, reason=SuspendReason.TIME_SLICE
    )


def test_a_gpu_taken_before_its_holder_let_go_is_an_overlap() -> None:
    overlaps, intervals = gpu_overlaps(events(started("a", "n1", 0, 1), started("b", "n1", 1)))
    assert [(o.node_id, o.gpu, o.holder, o.intruder) for o in overlaps] == [("n1", 1, "u/a", "u/b")]
    assert intervals == 3


def test_a_job_over_for_good_frees_its_gpus_though_its_kill_reports_nothing() -> None:
    cancelled = JobCancelled(user="u", job_id="a", previous_state=JobState.RUNNING)
    assert gpu_overlaps(events(started("a", "n1", 0), cancelled, started("b", "n1", 0)))[0] == []
    # Before its end, the same start is an overlap.
    early = events(started("a", "n1", 0), started("b", "n1", 0), cancelled)
    assert len(gpu_overlaps(early)[0]) == 1


def test_a_start_reported_after_its_jobs_end_is_killed_before_the_next_start_there() -> None:
    # The start was on its way to n1 when the cancel was read; the kill sent with the
    # cancel runs after it, and b's start after the kill.
    cancelled = JobCancelled(user="u", job_id="a", previous_state=JobState.RUNNING)
    late = events(cancelled, started("a", "n1", 0), started("b", "n1", 0))
    overlaps, intervals = gpu_overlaps(late)
    assert overlaps == []
    assert intervals == 2
    # It still may not start on GPUs another job holds.
    onto = events(started("b", "n1", 0), cancelled, started("a", "n1", 0))
    assert [(o.holder, o.intruder) for o in gpu_overlaps(onto)[0]] == [("u/b", "u/a")]


def test_suspends_and_migrations_free_gpus_on_their_own_node_only() -> None:
    moved = JobMigrated(
        user="u",
        job_id="a",
        from_node="n1",
        to_node="n2",
        reason=MigrationReason.LOAD_BALANCE,
        attempt=1,
    )
    fine = events(
        started("a", "n1", 0),
        suspended("a", "n2"),  # another node's report frees nothing here
        moved,
        started("b", "n1", 0),
        suspended("b", "n1"),
        JobResumed(user="u", job_id="a", node_id="n1", gpu_indices=(0,), attempt=1),
    )
    assert gpu_overlaps(fine)[0] == []
    assert most_nodes_at_once(fine) == {("u", "a"): 1, ("u", "b"): 1}
    twice = events(started("a", "n1", 0), started("a", "n2", 0))
    assert most_nodes_at_once(twice) == {("u", "a"): 2}


def test_lost_duplicated_and_unexpected_jobs_are_all_reported() -> None:
    submitted = JobSubmitted(user="u", job_id="a", gpus=1, command=("x",))
    failed = JobFailed(
        user="u", job_id="b", failure_class=FailureClass.USER_ERROR, reason="r", attempt=1
    )
    outcomes = Outcomes.of(
        events(
            submitted,
            JobCompleted(user="u", job_id="b", attempt=1),
            failed,
            JobCompleted(user="u", job_id="c", attempt=1),
        )
    )
    assert outcomes.submitted[("u", "a")] == 1
    problems = outcomes.problems({("u", "a"), ("u", "b")})
    assert problems == [
        "u/a: 0 terminal events []",
        "u/b: 2 terminal events ['JobCompleted', 'JobFailed']",
        "u/c: ended but never submitted by the test",
    ]


def submitted(job: str, gpus: int) -> JobSubmitted:
    return JobSubmitted(user="u", job_id=job, gpus=gpus, command=("x",))


def test_a_copy_left_on_a_failed_node_is_not_held_once_its_job_runs_elsewhere() -> None:
    # x ran on n1, n1 was declared failed, x started on n2; the copy on n1 was fenced (a kill
    # reports nothing), then y started on n1's GPU.
    fenced = events(
        submitted("x", 1),
        submitted("y", 1),
        started("x", "n1", 0),
        started("x", "n2", 0),
        started("y", "n1", 0),
    )
    assert gpu_overlaps(fenced)[0] == []


def test_a_gang_part_on_another_node_does_not_release_the_first() -> None:
    gang = [
        submitted("g", 4),
        submitted("y", 1),
        started("g", "n1", 0, 1),
        started("g", "n2", 0, 1),
    ]
    overlaps, _ = gpu_overlaps(events(*gang, started("y", "n1", 1)))
    assert [(o.holder, o.intruder) for o in overlaps] == [("u/g", "u/y")]
    assert gpu_overlaps(events(*gang, suspended("g", "n1"), started("y", "n1", 1)))[0] == []
