"""Classic stride (docs/design.md §2.1), including the slides' worked example."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gfair.sim.baselines.stride import StrideQueue

# Slides: A has 4 tickets, B 1. Time -> (A's pass, B's pass, job run).
SLIDES = [
    (0, 0, "B"),
    (0, 1, "A"),
    (0.25, 1, "A"),
    (0.5, 1, "A"),
    (0.75, 1, "A"),
    (1, 1, "B"),
    (1, 2, "A"),
    (1.25, 2, "A"),
    (1.5, 2, "A"),
]


def test_slides_table_is_reproduced_with_first_come_tie_break() -> None:
    # Ties go to the job that joined first; the slides run B at the ties of t0 and t5, which is
    # this rule with B queued before A.
    queue = StrideQueue()
    queue.join("B", 1)
    queue.join("A", 4)
    for a_pass, b_pass, expected in SLIDES:
        assert queue.passes() == {"A": a_pass, "B": b_pass}
        assert queue.next() == expected


def test_with_a_queued_first_only_the_ties_change_hands() -> None:
    queue = StrideQueue()
    queue.join("A", 4)
    queue.join("B", 1)
    schedule = [queue.next() for _ in range(10)]
    assert schedule == ["A", "B", "A", "A", "A", "A", "B", "A", "A", "A"]
    assert schedule[:5].count("A") == schedule[5:].count("A") == 4


def test_a_job_joins_at_the_minimum_pass_plus_its_lag() -> None:
    queue = StrideQueue()
    queue.join("A", 1)
    queue.join("B", 2)
    for _ in range(5):
        queue.next()
    low = min(queue.passes().values())
    queue.join("C", 1)
    assert queue.passes()["C"] == low
    lag = queue.leave("C")
    assert lag == 0
    queue.join("D", 1, lag=0.5)
    assert queue.passes()["D"] == low + 0.5


def test_an_emptied_queue_remembers_how_far_it_got() -> None:
    queue = StrideQueue()
    queue.join("A", 1)
    for _ in range(3):
        queue.next()
    queue.leave("A")
    queue.join("B", 1)
    assert queue.passes()["B"] == 3.0


def test_snapshot_and_restore_continue_identically() -> None:
    queue = StrideQueue()
    for name, tickets in (("A", 3), ("B", 1), ("C", 2)):
        queue.join(name, tickets)
    for _ in range(7):
        queue.next()
    copy = StrideQueue()
    copy.restore(queue.snapshot())
    assert [queue.next() for _ in range(20)] == [copy.next() for _ in range(20)]


@settings(max_examples=60, deadline=None)
@given(tickets=st.lists(st.integers(1, 10), min_size=1, max_size=8), quanta=st.integers(1, 400))
def test_runs_track_tickets_within_one_stride(tickets: list[int], quanta: int) -> None:
    queue = StrideQueue()
    for index, count in enumerate(tickets):
        queue.join(f"j{index}", count)
    runs = dict.fromkeys(queue.passes(), 0)
    for _ in range(quanta):
        job = queue.next()
        assert job is not None
        runs[job] += 1
    # runs / tickets is each job's pass; the minimum-pass job always runs, so passes stay
    # within the largest stride (1 / smallest ticket count) of each other.
    normalised = [runs[f"j{i}"] / t for i, t in enumerate(tickets)]
    assert max(normalised) - min(normalised) <= 1 / min(tickets) + 1e-9
