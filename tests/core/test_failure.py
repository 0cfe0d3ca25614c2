"""Failure classification, retry budgets and back-off, node health (docs/design.md §2.6)."""

from __future__ import annotations

import signal

import pytest

from gfair.core.failure import ExitFacts, FailureClass, classify
from gfair.core.health import (
    HeartbeatPolicy,
    Liveness,
    NodeFailure,
    QuarantinePolicy,
    liveness,
    node_verdict,
    nodes_to_quarantine,
    unheard,
)
from gfair.core.retry import BackOff, RetryPolicy, decide

F = FailureClass


@pytest.mark.parametrize(
    ("facts", "kind", "rule", "reason"),
    [
        (ExitFacts(exit_code=0), F.SUCCESS, "exit-code", "exited 0"),
        (ExitFacts(exit_code=1, requested_stop=True), F.PREEMPTED, "requested-stop", ""),
        (ExitFacts(exit_code=0, node_lost=True), F.INFRASTRUCTURE, "node-lost", "node lost"),
        (ExitFacts(executor_crashed=True), F.INFRASTRUCTURE, "executor", "executor crashed"),
        (ExitFacts(exit_code=1, xids=(13, 79)), F.INFRASTRUCTURE, "xid", "XID 79 (GPU has fallen"),
        (ExitFacts(exit_code=1, xids=(13,)), F.USER_ERROR, "exit-code", "exit code 1"),
        (
            ExitFacts(exit_code=1, stderr_tail="step 9\nRuntimeError: CUDA out of memory. Tried"),
            F.OUT_OF_MEMORY,
            "stderr",
            "CUDA out of memory: RuntimeError: CUDA out of memory",
        ),
        (
            ExitFacts(exit_code=1, stderr_tail="NCCL error in: unhandled system error"),
            F.INFRASTRUCTURE,
            "stderr",
            "NCCL error",
        ),
        (
            ExitFacts(exit_code=1, stderr_tail="kernel: NVRM: Xid (PCI:0000:3b:00): 48"),
            F.INFRASTRUCTURE,
            "stderr",
            "NVML Xid",
        ),
        (ExitFacts(signal=signal.SIGKILL), F.INFRASTRUCTURE, "signal", "SIGKILL nobody asked"),
        (ExitFacts(signal=signal.SIGSEGV), F.USER_ERROR, "signal", "crashed with SIGSEGV"),
        (
            ExitFacts(exit_code=2, stderr_tail="Traceback\nKeyError: 'lr'\n"),
            F.USER_ERROR,
            "exit-code",
            "exit code 2: KeyError: 'lr'",
        ),
    ],
)
def test_exits_are_classified_by_the_first_matching_rule(
    facts: ExitFacts, kind: FailureClass, rule: str, reason: str
) -> None:
    result = classify(facts)
    assert (result.kind, result.rule) == (kind, rule)
    assert reason in result.reason


def test_a_user_error_is_retried_once_then_fails_with_its_reason() -> None:
    failure = classify(ExitFacts(exit_code=2, stderr_tail="KeyError: 'lr'"))
    first = decide(failure, {})
    assert first.retry and first.attempt == 1 and not first.avoid_node
    second = decide(failure, {F.USER_ERROR: 1})
    assert not second.retry
    assert second.reason == "user_error: exit code 2: KeyError: 'lr'; retry budget spent (1 of 1)"


def test_infrastructure_failures_back_off_exponentially_on_another_node() -> None:
    failure = classify(ExitFacts(node_lost=True))
    policy = RetryPolicy(backoff=BackOff(base_s=10, factor=2, cap_s=60, jitter=0))
    delays = [decide(failure, {F.INFRASTRUCTURE: n}, policy).delay_s for n in range(5)]
    assert delays == [10, 20, 40, 60, 60]
    decision = decide(failure, {F.INFRASTRUCTURE: 2}, policy)
    assert decision.avoid_node and decision.resume_from_checkpoint
    assert not decide(failure, {F.INFRASTRUCTURE: 5}, policy).retry


def test_preemption_resumes_at_once_and_costs_no_budget() -> None:
    decision = decide(classify(ExitFacts(requested_stop=True)), {F.PREEMPTED: 1000})
    assert decision.retry and decision.delay_s == 0 and decision.attempt == 0


def test_success_is_not_retried() -> None:
    assert not decide(classify(ExitFacts(exit_code=0)), {}).retry


def test_budgets_are_configurable() -> None:
    policy = RetryPolicy(budgets={F.USER_ERROR: 3})
    failure = classify(ExitFacts(exit_code=1))
    assert decide(failure, {F.USER_ERROR: 2}, policy).retry
    assert not decide(classify(ExitFacts(node_lost=True)), {}, policy).retry  # budget 0


def test_jitter_is_deterministic_per_seed_and_stays_within_bounds() -> None:
    backoff = BackOff(base_s=100, factor=2, cap_s=1000, jitter=0.2)
    same = {backoff.delay(2, seed=7) for _ in range(3)}
    assert len(same) == 1
    spread = {backoff.delay(2, seed=s) for s in range(50)}
    assert len(spread) > 40
    assert all(160 <= d <= 240 for d in spread)
    assert all(backoff.delay(9, seed=s) <= 1000 for s in range(50))
    assert backoff.delay(2) == 200  # no seed, no jitter


def test_liveness_suspects_then_fails_a_silent_node() -> None:
    policy = HeartbeatPolicy(suspect_after_s=10, fail_after_s=30)
    assert liveness(100, 105, policy) is Liveness.ALIVE
    assert liveness(100, 111, policy) is Liveness.SUSPECTED
    assert liveness(100, 131, policy) is Liveness.FAILED


def test_a_detector_that_hears_no_node_of_several_is_likely_deaf() -> None:
    policy = HeartbeatPolicy(suspect_after_s=10, fail_after_s=30)
    assert unheard([100, 101], 140, policy)  # both silent: more likely the detector's feed
    assert not unheard([100, 135], 140, policy)  # one alive: the other's silence is its own
    assert not unheard([100], 140, policy)  # a single node: nothing to tell it from
    assert not unheard([], 140, policy)


def test_a_node_failing_jobs_repeatedly_within_the_window_is_quarantined() -> None:
    policy = QuarantinePolicy(max_failures=3, window_s=100)
    history = [
        NodeFailure("n1", 10, F.INFRASTRUCTURE),
        NodeFailure("n1", 150, F.INFRASTRUCTURE),
        NodeFailure("n1", 160, F.USER_ERROR),  # says nothing about the node
        NodeFailure("n1", 170, F.INFRASTRUCTURE),
        NodeFailure("n2", 171, F.INFRASTRUCTURE),
    ]
    assert not node_verdict("n1", history, 170, policy).quarantine  # t=10 is out of the window
    history.append(NodeFailure("n1", 180, F.INFRASTRUCTURE))
    verdict = node_verdict("n1", history, 180, policy)
    assert verdict.quarantine and verdict.failures_in_window == 3
    assert verdict.reason == "3 infrastructure failures in the last 100s (limit 3)"
    assert [v.node_id for v in nodes_to_quarantine(history, 180, policy)] == ["n1"]
    assert nodes_to_quarantine(history, 400, policy) == ()
