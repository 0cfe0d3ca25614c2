"""What a job's failure (or success) leads to: completed, retried, or failed for good.

The retry policy is the core's (`gfair.core.retry.decide`: per-class budgets, exponential
back-off); on top of it the submission's own `max_retries` caps the retries of every class
together. A retry resumes from the job's last checkpoint when the policy says so.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from gfair.core.failure import Classification
from gfair.core.retry import RetryPolicy, decide
from gfair.events.fields import MAX_ATTEMPTS, MAX_STDERR_TAIL_CHARS
from gfair.events.jobs import JobCompleted, JobExited, JobFailed, JobRetried
from gfair.events.reasons import FailureClass
from gfair.events.states import JobState
from gfair.state.job_failures import (
    MAX_DECISIONS_KEPT,
    FailureDecision,
    JobFailureRecord,
    Outcome,
)
from gfair_services.failure_detector.change import Change

# The classes a run's failure is put in (`decide_failure`), in the order the core lists them.
FAILURE_CLASSES = tuple(
    k.value for k in FailureClass if k not in (FailureClass.SUCCESS, FailureClass.CANCELLED)
)
# A job that ends no longer runs anywhere.
_STOPPED: dict[str, object] = {"running_on": None, "running_since": None}


def job_seed(key: str) -> int:
    """Spreads retry delays per job, the same on every redelivery (the core is seedless)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def decide_failure(
    record: JobFailureRecord,
    classification: Classification,
    node_id: str,
    now: datetime,
    policy: RetryPolicy,
    *,
    exit: JobExited | None,
) -> Change:
    """The job's next event and record after `classification` of how its run `exit`ed.

    `exit` is None when the run did not end by itself (it hung and is being killed).
    """
    kind = classification.kind
    if kind is FailureClass.SUCCESS:
        return _completed(record, classification, node_id, now, exit)
    decision = decide(classification, record.retries, policy, seed=job_seed(record.key))
    retry, reason = decision.retry, decision.reason
    if retry and record.max_retries is not None and record.total_retries >= record.max_retries:
        retry = False
        reason = (
            f"{kind.value}: {classification.reason}; "
            f"the submission's max_retries ({record.max_retries}) is spent"
        )
    if retry and record.attempt >= MAX_ATTEMPTS:
        retry = False
        reason = f"{kind.value}: {classification.reason}; attempt limit {MAX_ATTEMPTS} reached"
    if not retry:
        return _failed(record, kind, reason, node_id, now, exit)
    resume = record.last_checkpoint_step if decision.resume_from_checkpoint else None
    retried = JobRetried(
        user=record.user,
        job_id=record.job_id,
        attempt=record.attempt + 1,
        delay_s=decision.delay_s,
        failure_class=kind,
        reason=reason,
        resume_from_step=resume,
    )
    counts = dict(record.retries)
    counts[kind] = counts.get(kind, 0) + 1
    next_attempt = record.model_copy(
        update={**_STOPPED, "attempt": record.attempt + 1, "retries": counts}
    )
    note = _note(record, "retried" if exit is not None else "hung", kind, reason, node_id, now)
    note = note.model_copy(update={"delay_s": decision.delay_s, "resume_from_step": resume})
    return Change(events=(retried,), jobs=(noted(next_attempt, note),))


def _completed(
    record: JobFailureRecord,
    classification: Classification,
    node_id: str,
    now: datetime,
    exit: JobExited | None,
) -> Change:
    runtime = exit.runtime_s if exit is not None else None
    if record.first_started_at is not None:
        runtime = (now - record.first_started_at).total_seconds()
    completed = JobCompleted(
        user=record.user,
        job_id=record.job_id,
        attempt=record.attempt,
        runtime_s=max(runtime, 0.0) if runtime is not None else None,
        iterations=record.iterations,
    )
    done = record.model_copy(update={**_STOPPED, "terminal": JobState.COMPLETED, "ended_at": now})
    note = _note(record, "completed", FailureClass.SUCCESS, classification.reason, node_id, now)
    return Change(events=(completed,), jobs=(noted(done, note),))


def _failed(
    record: JobFailureRecord,
    kind: FailureClass,
    reason: str,
    node_id: str,
    now: datetime,
    exit: JobExited | None,
) -> Change:
    failed = JobFailed(
        user=record.user,
        job_id=record.job_id,
        failure_class=kind,
        reason=reason,
        attempt=record.attempt,
        node_id=node_id,
        exit_code=exit.exit_code if exit else None,
        signal=exit.signal if exit else None,
        stderr_tail=exit.stderr_tail[-MAX_STDERR_TAIL_CHARS:] if exit else "",
    )
    done = record.model_copy(update={**_STOPPED, "terminal": JobState.FAILED, "ended_at": now})
    note = _note(record, "failed", kind, reason, node_id, now)
    return Change(events=(failed,), jobs=(noted(done, note),))


def _note(
    record: JobFailureRecord,
    outcome: Outcome,
    kind: FailureClass,
    reason: str,
    node_id: str,
    now: datetime,
) -> FailureDecision:
    return FailureDecision(
        time=now,
        attempt=record.attempt,
        outcome=outcome,
        failure_class=kind,
        reason=reason,
        node_id=node_id,
    )


def noted(record: JobFailureRecord, decision: FailureDecision) -> JobFailureRecord:
    """`record` with `decision` added to the ones `gfair why` shows."""
    return record.model_copy(
        update={"decisions": (*record.decisions, decision)[-MAX_DECISIONS_KEPT:]}
    )
