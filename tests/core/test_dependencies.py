"""Dependencies (`gfair.core.admission`): held until completed, cancelled down the chain."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gfair.core.admission import DependencyOutcome, Readiness, eligibility


def test_a_job_waits_for_the_dependencies_not_ended() -> None:
    verdict = eligibility(
        ["a", "b", "c"],
        {
            "a": DependencyOutcome.COMPLETED,
            "b": DependencyOutcome.PENDING,
            "c": DependencyOutcome.PENDING,
        },
    )
    assert verdict.readiness is Readiness.HELD
    assert verdict.waiting_on == ("b", "c")
    assert "waiting for b, c" in verdict.reason


def test_completed_dependencies_release_it_at_once() -> None:
    assert eligibility(["a"], {"a": DependencyOutcome.COMPLETED}).readiness is Readiness.READY
    assert eligibility([], {}).readiness is Readiness.READY


def test_a_failed_dependency_dooms_it_even_while_others_wait_and_names_the_failure() -> None:
    outcomes = {"a": DependencyOutcome.PENDING, "b": DependencyOutcome.CANCELLED}
    verdict = eligibility(["a", "b"], outcomes)
    assert verdict.readiness is Readiness.DOOMED
    assert verdict.blocker == "b"
    assert "dependency b cancelled" in verdict.reason


def test_an_unknown_dependency_is_told_apart() -> None:
    verdict = eligibility(["a", "ghost"], {"a": DependencyOutcome.PENDING})
    assert verdict.readiness is Readiness.UNKNOWN
    assert verdict.blocker == "ghost"


_ENDS = st.sampled_from(
    [DependencyOutcome.COMPLETED, DependencyOutcome.FAILED, DependencyOutcome.CANCELLED]
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 11), max_size=3), min_size=12, max_size=12),
    st.lists(_ENDS, min_size=12, max_size=12),
)
def test_a_held_job_never_runs_and_a_failure_cancels_everything_downstream(
    graph: list[list[int]], ends: list[DependencyOutcome]
) -> None:
    # Jobs 0..11, each depending on some earlier ones (a DAG, as admission makes it: only known
    # jobs can be named). Run the rule as placement does until nothing changes: a released job
    # ends as `ends` says, a doomed one is cancelled.
    deps = {i: sorted({d for d in graph[i] if d < i}) for i in range(12)}
    outcomes: dict[str, DependencyOutcome] = {str(i): DependencyOutcome.PENDING for i in range(12)}
    ran: set[int] = set()
    changed = True
    while changed:
        changed = False
        for job in range(12):
            if outcomes[str(job)] is not DependencyOutcome.PENDING:
                continue
            verdict = eligibility([str(d) for d in deps[job]], outcomes)
            if verdict.readiness is Readiness.READY:
                ran.add(job)
                outcomes[str(job)] = ends[job]
                changed = True
            elif verdict.readiness is Readiness.DOOMED:
                outcomes[str(job)] = DependencyOutcome.CANCELLED
                changed = True
    for job in range(12):
        # Every job is decided: none is left held when nothing is pending.
        assert outcomes[str(job)] is not DependencyOutcome.PENDING
        if job in ran:
            assert all(outcomes[str(d)] is DependencyOutcome.COMPLETED for d in deps[job])
        else:
            # Never ran: some dependency did not complete (transitively, something failed).
            assert any(outcomes[str(d)] is not DependencyOutcome.COMPLETED for d in deps[job])
            assert outcomes[str(job)] is DependencyOutcome.CANCELLED
