"""The failure detector's ledger of each job: attempts, retries per class, and its decisions.

One `JobFailureRecord` per job in the `gfair_failures` bucket (key '<user>.<job_id>'), written
only by the failure detector. The retry budget of a job must survive a restart of the detector
(docs/design.md §3.3), and replaying the whole job stream to recount retries would make its start
time grow with the cluster's age, hence a bucket of its own. `decisions` explain, for `gfair why`,
every completion, retry and failure the detector declared.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, Field

from gfair.events.fields import Attempt, JobId, NodeId, Reason, UserName
from gfair.events.reasons import FailureClass
from gfair.events.states import JobState
from gfair.state.buckets import FAILURES, job_key
from gfair.state.record import Record

BUCKET = FAILURES.name
MAX_DECISIONS_KEPT = 20

Outcome = Literal["completed", "retried", "failed", "node_lost", "hung"]


class FailureDecision(Record):
    """One thing the detector concluded about a job, and why."""

    time: AwareDatetime
    attempt: Attempt
    outcome: Outcome
    failure_class: FailureClass
    reason: Reason
    node_id: NodeId | None = None
    delay_s: float | None = None
    resume_from_step: int | None = None


class JobFailureRecord(Record):
    user: UserName
    job_id: JobId
    # The attempt the job is on: 1 until the first retry. Exits of earlier attempts are stale.
    attempt: Attempt = 1
    submitted_at: AwareDatetime | None = None
    max_retries: int | None = Field(default=None, description="From the submission, if set")
    retries: dict[FailureClass, int] = Field(default_factory=dict)
    running_on: NodeId | None = None
    running_since: AwareDatetime | None = None
    first_started_at: AwareDatetime | None = None
    last_checkpoint_step: int | None = None
    iterations: int | None = None
    # Set once the job completed, failed or was cancelled: later exits are ignored.
    terminal: JobState | None = None
    # When the detector learnt of its end; the record is purged a retention after it.
    ended_at: AwareDatetime | None = None
    # The correlation id of the job's events, carried by what the detector emits on a timer.
    correlation_id: str | None = None
    decisions: tuple[FailureDecision, ...] = ()

    @property
    def key(self) -> str:
        return job_key(self.user, self.job_id)

    @property
    def total_retries(self) -> int:
        return sum(self.retries.values())


__all__ = [
    "BUCKET",
    "FAILURES",
    "MAX_DECISIONS_KEPT",
    "FailureDecision",
    "JobFailureRecord",
    "Outcome",
]
