"""The admission machine (`gfair.core.admission`): what placement and the simulator both drive."""

from __future__ import annotations

from gfair.core import admission as adm

DONE = adm.DependencyOutcome.COMPLETED


def test_a_held_job_is_released_when_its_dependency_completes() -> None:
    admission = adm.Admitter()
    assert admission.apply(adm.Arrived("ann", "prep")) == [adm.Admit("ann", "prep")]
    (hold,) = admission.apply(adm.Arrived("ann", "train", ("prep",)))
    assert isinstance(hold, adm.Hold) and hold.waiting_on == ("prep",)
    assert admission.held("ann", "train") == "waiting for prep to complete (after_ok)"
    (admit,) = admission.apply(adm.Finished("ann", "prep", DONE))
    assert admit == adm.Admit("ann", "train", "every job it depends on completed")
    assert admission.held("ann", "train") is None


def test_a_failure_cancels_the_chain_link_by_link() -> None:
    admission = adm.Admitter()
    admission.apply(adm.Arrived("ann", "prep"))
    admission.apply(adm.Arrived("ann", "fit", ("prep",)))
    admission.apply(adm.Arrived("ann", "report", ("fit",)))
    decided = admission.apply(adm.Finished("ann", "prep", adm.DependencyOutcome.FAILED))
    assert [type(d) for d in decided] == [adm.Cancel, adm.Cancel]
    assert [d.job_id for d in decided] == ["fit", "report"]
    assert "dependency fit cancelled" in decided[1].reason


def test_unknown_and_failed_dependencies_are_refused_at_submission() -> None:
    admission = adm.Admitter()
    (unknown,) = admission.apply(adm.Arrived("ann", "a", ("ghost",)))
    assert isinstance(unknown, adm.Refuse) and unknown.code == adm.UNKNOWN_DEPENDENCY
    # Jobs of another user are no jobs of this one.
    admission.apply(adm.Arrived("bob", "x"))
    (other,) = admission.apply(adm.Arrived("ann", "b", ("x",)))
    assert isinstance(other, adm.Refuse) and other.code == adm.UNKNOWN_DEPENDENCY
    (doomed,) = admission.apply(adm.Arrived("ann", "c", ("a",)))  # `a` was rejected
    assert isinstance(doomed, adm.Refuse) and doomed.code == adm.DEPENDENCY_FAILED


def test_a_drivers_refusal_makes_the_job_known_as_rejected() -> None:
    admission = adm.Admitter()
    (refused,) = admission.apply(adm.Arrived("ann", "big", refusal=("limit_exceeded", "too big")))
    assert refused == adm.Refuse("ann", "big", "limit_exceeded", "too big")
    (doomed,) = admission.apply(adm.Arrived("ann", "next", ("big",)))
    assert isinstance(doomed, adm.Refuse) and doomed.code == adm.DEPENDENCY_FAILED


def test_an_array_admits_at_most_its_limit_and_the_next_member_as_one_ends() -> None:
    admission = adm.Admitter()
    decided = [admission.apply(adm.Arrived("ann", f"m{i}", (), "sweep", 2))[0] for i in range(4)]
    assert [type(d) for d in decided] == [adm.Admit, adm.Admit, adm.Hold, adm.Hold]
    assert admission.held("ann", "m2") == "waiting for a slot of array sweep"
    (admit,) = admission.apply(adm.Finished("ann", "m0", DONE))
    assert admit.job_id == "m2"
    # A member refused after all (`REJECTED`) gives its slot to the next one too.
    (admit,) = admission.apply(adm.Finished("ann", "m2", adm.DependencyOutcome.REJECTED))
    assert admit.job_id == "m3"


def test_a_held_array_member_meets_its_arrays_limit_once_released() -> None:
    admission = adm.Admitter()
    admission.apply(adm.Arrived("ann", "prep"))
    admission.apply(adm.Arrived("ann", "m0", (), "sweep", 1))
    admission.apply(adm.Arrived("ann", "m1", ("prep",), "sweep", 1))
    (hold,) = admission.apply(adm.Finished("ann", "prep", DONE))
    assert isinstance(hold, adm.Hold) and hold.job_id == "m1"
    assert admission.apply(adm.Finished("ann", "m0", DONE))[0].job_id == "m1"


def test_what_a_store_says_is_taken_and_a_forgotten_job_is_no_job() -> None:
    admission = adm.Admitter()
    admission.apply(adm.Known("ann", "prep"))
    admission.apply(adm.Known("ann", "train", ("prep",), None))  # held, as its record says
    assert admission.dependents("ann", "prep") == ("train",)
    assert admission.apply(adm.Finished("ann", "prep", DONE))[0] == adm.Admit(
        "ann", "train", "every job it depends on completed"
    )
    admission.apply(adm.Purged((("ann", "prep"),)))
    (refused,) = admission.apply(adm.Arrived("ann", "again", ("prep",)))
    assert isinstance(refused, adm.Refuse) and refused.code == adm.UNKNOWN_DEPENDENCY
