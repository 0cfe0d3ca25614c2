"""Retry policy for failed jobs (docs/design.md §2.6): per-class budgets and exponential back-off.

- success: nothing to retry;
- preempted: resumed from its checkpoint right away, never counted against a budget;
- infrastructure: resumed from the last checkpoint on another node, up to its budget (default 5);
- out-of-memory and user errors: a deterministic failure would only repeat, so each is retried at
  most once by default (a transient cause gets one more chance), then the job fails with its
  reason.

The n-th retry of a class waits ``min(cap, base * factor**(n-1))`` seconds. With a seed, that
delay is spread by up to ``jitter`` of itself either way (still within the cap), so jobs failing
together do not all come back together; the spread is a pure function of (seed, class, n).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gfair.core.failure import Classification, FailureClass


@dataclass(frozen=True)
class BackOff:
    base_s: float = 10.0
    factor: float = 2.0
    cap_s: float = 600.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.cap_s < 0:
            raise ValueError("back-off base_s and cap_s must be >= 0")
        if self.factor < 1:
            raise ValueError(f"back-off factor must be >= 1, got {self.factor}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"back-off jitter must be in [0, 1], got {self.jitter}")

    def delay(self, attempt: int, seed: int | None = None, salt: str = "") -> float:
        """Seconds to wait before retry number `attempt` (1-based)."""
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {attempt}")
        # Exponent capped so that huge attempt numbers do not overflow a float.
        delay = min(self.cap_s, self.base_s * self.factor ** min(attempt - 1, 1024))
        if seed is None or self.jitter == 0:
            return delay
        digest = hashlib.blake2b(f"{seed}:{salt}:{attempt}".encode(), digest_size=8).digest()
        unit = int.from_bytes(digest, "big") / 2**64  # in [0, 1)
        return min(self.cap_s, delay * (1 + self.jitter * (2 * unit - 1)))


DEFAULT_BUDGETS: Mapping[FailureClass, int] = MappingProxyType(
    {
        FailureClass.USER_ERROR: 1,
        FailureClass.OUT_OF_MEMORY: 1,
        FailureClass.INFRASTRUCTURE: 5,
    }
)


@dataclass(frozen=True)
class RetryPolicy:
    budgets: Mapping[FailureClass, int] = field(default_factory=lambda: DEFAULT_BUDGETS)
    backoff: BackOff = field(default_factory=BackOff)

    def __post_init__(self) -> None:
        for kind, budget in self.budgets.items():
            if budget < 0:
                raise ValueError(f"retry budget of {kind} must be >= 0, got {budget}")


@dataclass(frozen=True)
class RetryDecision:
    kind: FailureClass
    retry: bool
    delay_s: float
    attempt: int  # the retry number this would be for the class (0 when not retried)
    resume_from_checkpoint: bool
    avoid_node: bool  # place it on another node
    reason: str


def decide(
    classification: Classification,
    retries_so_far: Mapping[FailureClass, int],
    policy: RetryPolicy | None = None,
    seed: int | None = None,
) -> RetryDecision:
    """Whether and when to run a job again after `classification`.

    `retries_so_far` counts the retries the job already had per class.
    """
    policy = policy or RetryPolicy()
    kind = classification.kind
    if kind is FailureClass.SUCCESS:
        return RetryDecision(kind, False, 0.0, 0, False, False, "completed")
    if kind is FailureClass.PREEMPTED:
        return RetryDecision(
            kind, True, 0.0, 0, True, False, f"preempted ({classification.reason}); resumes"
        )
    used = retries_so_far.get(kind, 0)
    budget = policy.budgets.get(kind, 0)
    if used >= budget:
        reason = f"{kind.value}: {classification.reason}; retry budget spent ({used} of {budget})"
        return RetryDecision(kind, False, 0.0, 0, False, False, reason)
    attempt = used + 1
    delay = policy.backoff.delay(attempt, seed, kind.value)
    infrastructure = kind is FailureClass.INFRASTRUCTURE
    reason = (
        f"{kind.value}: {classification.reason}; retry {attempt} of {budget} in {delay:.1f}s"
        + (" on another node" if infrastructure else "")
    )
    return RetryDecision(kind, True, delay, attempt, True, infrastructure, reason)
