"""The admission machine (`gfair.core.admission`): what placement and the simulator both drive."""

from __future__ import annotations

from gfair.core.admission import (
    DEPENDENCY_FAILED,
    UNKNOWN_DEPENDENCY,
    Admit,
    Admitter,
    Arrived,
    Cancel,
    DependencyOutcome,
    Finished,
    Hold,
    Known,
    Purged,
    Refuse,
)

DONE = DependencyOutcome.COMPLETED


def test_a_held_job_is_released_when_its_dependency_completes() -> None:
    admission = Admitter()
    assert admission.apply(Arrived("ann", "prep")) == [Admit("ann", "prep")]
    (hold,) = admission.apply(Arrived("ann", "train", ("prep",)))
    assert isinstance(hold, Hold) and hold.waiting_on == ("prep",)
    assert admission.held("ann", "train") == "waiting for prep to complete (after_ok)"
    (admit,) = admission.apply(Finished("ann", "prep", DONE))
    assert admit == Admit("ann", "train", "every job it depends on completed")
    assert admission.held("ann", "train") is None


def test_a_failure_cancels_the_chain_link_by_link() -> None:
    admission = Admitter()
    admission.apply(Arrived("ann", "prep"))
    admission.apply(Arrived("ann", "fit", ("prep",)))
    admission.apply(Arrived("ann", "report", ("fit",)))
    decided = admission.apply(Finished("ann", "prep", DependencyOutcome.FAILED))
    assert [type(d) for d in decided] == [Cancel, Cancel]
    assert [d.job_id for d in decided] == ["fit", "report"]
    assert "dependency fit cancelled" in decided[1].reason


def test_unknown_and_failed_dependencies_are_refused_at_submission() -> None:
    admission = Admitter()
    (unknown,) = admission.apply(Arrived("ann", "a", ("ghost",)))
    assert isinstance(unknown, Refuse) and unknown.code == UNKNOWN_DEPENDENCY
    # Jobs of another user are no jobs of this one.
    admission.apply(Arrived("bob", "x"))
    (other,) = admission.apply(Arrived("ann", "b", ("x",)))
    assert isinstance(other, Refuse) and other.code == UNKNOWN_DEPENDENCY
    (doomed,) = admission.apply(Arrived("ann", "c", ("a",)))  # `a` was rejected
    assert isinstance(doomed, Refuse) and doomed.code == DEPENDENCY_FAILED


def test_a_drivers_refusal_makes_the_job_known_as_rejected() -> None:
    admission = Admitter()
    (refused,) = admission.apply(Arrived("ann", "big", refusal=("limit_exceeded", "too big")))
    assert refused == Refuse("ann", "big", "limit_exceeded", "too big")
    (doomed,) = admission.apply(Arrived("ann", "next", ("big",)))
    assert isinstance(doomed, Refuse) and doomed.code == DEPENDENCY_FAILED


def test_an_array_admits_at_most_its_limit_and_the_next_member_as_one_ends() -> None:
    admission = Admitter()
    decided = [admission.apply(Arrived("ann", f"m{i}", (), "sweep", 2))[0] for i in range(4)]
    assert [type(d) for d in decided] == [Admit, Admit, Hold, Hold]
    assert admission.held("ann", "m2") == "waiting for a slot of array sweep"
    (admit,) = admission.apply(Finished("ann", "m0", DONE))
    assert admit.job_id == "m2"
    # A member refused after all (`REJECTED`) gives its slot to the next one too.
    (admit,) = admission.apply(Finished("ann", "m2", DependencyOutcome.REJECTED))
    assert admit.job_id == "m3"


def test_a_held_array_member_meets_its_arrays_limit_once_released() -> None:
    admission = Admitter()
    admission.apply(Arrived("ann", "prep"))
    admission.apply(Arrived("ann", "m0", (), "sweep", 1))
    admission.apply(Arrived("ann", "m1", ("prep",), "sweep", 1))
    (hold,) = admission.apply(Finished("ann", "prep", DONE))
    assert isinstance(hold, Hold) and hold.job_id == "m1"
    assert admission.apply(Finished("ann", "m0", DONE))[0].job_id == "m1"


def test_what_a_store_says_is_taken_and_a_forgotten_job_is_no_job() -> None:
    admission = Admitter()
    admission.apply(Known("ann", "prep"))
    admission.apply(Known("ann", "train", ("prep",), None))  # held, as its record says
    assert admission.dependents("ann", "prep") == ("train",)
    assert admission.apply(Finished("ann", "prep", DONE))[0] == Admit(
        "ann", "train", "every job it depends on completed"
    )
    admission.apply(Purged((("ann", "prep"),)))
    (refused,) = admission.apply(Arrived("ann", "again", ("prep",)))
    assert isinstance(refused, Refuse) and refused.code == UNKNOWN_DEPENDENCY
