"""What tools publish: job submissions and cancellation requests.

Job ids are chosen by the submitting tool, not assigned by the cluster. The tool therefore knows
where the job's events will appear (`gfair.job.<user>.<job_id>.>`) before it publishes, and can
subscribe first without racing the scheduler. A job id is a subject token
(`[A-Za-z0-9_-]{1,64}`) unique among the user's jobs; `new_job_id()` makes one. Submitting an id
the user already used is rejected with `duplicate_job_id`, unless it is a redelivery of the same
envelope (same envelope id), which changes nothing.
"""

from __future__ import annotations

import re
import secrets
from typing import Self

from pydantic import Field, model_validator

from gfair.events.fields import (
    MAX_ENV_VARS,
    MAX_RETRIES,
    GpuCount,
    Name,
    Reason,
    Tickets,
)
from gfair.events.job_array import ArrayMembership, Dependencies, member_job_id
from gfair.events.jobs import JobEvent, JobLaunch
from gfair.events.registry import register
from gfair.events.states import JobState
from gfair.events.subjects import PREFIX, cancel_subject, submit_subject

_NOT_IN_TOKEN = re.compile(r"[^A-Za-z0-9_-]+")


def new_job_id(name: str | None = None) -> str:
    """A fresh job id: `<name>-<12 random hex>` (the name squeezed into a token), or hex alone."""
    suffix = secrets.token_hex(6)
    if not name:
        return suffix
    stem = _NOT_IN_TOKEN.sub("-", name).strip("-")[: 64 - len(suffix) - 1]
    return f"{stem}-{suffix}" if stem else suffix


@register
class JobSubmitted(JobEvent, JobLaunch):
    """A request to run a job for `user`; published by tools on `gfair.submit.<user>`.

    The user pays with its fair share: `tickets` only weighs this job against the same user's
    other jobs (default: all equal, docs/design.md §1.1); it never raises the user's share.
    `array` makes it a member of a job array (`gfair.events.job_array`): its id must then be
    ``<array.id>-<array.index>``, and `array.limit` only restricts how many of the array run.
    `after_ok` holds it until each of those jobs of the same user completed successfully; it is
    cancelled when one of them fails or is cancelled (docs/design.md §1.6).
    """

    EVENT_TYPE = "gfair.job.submitted.v1"
    JOB_STATE = JobState.SUBMITTED

    gpus: GpuCount = Field(description="GPUs the job needs at once (gang)")
    tickets: Tickets | None = Field(
        default=None, description="Weight among the user's own jobs; default equal"
    )
    job_type: Name | None = Field(
        default=None,
        description="Model family for throughput seeding, e.g. 'ResNet-50 (batch size 64)'",
    )
    name: Name | None = Field(default=None, description="Human-readable label")
    max_retries: int | None = Field(
        default=None,
        ge=0,
        le=MAX_RETRIES,
        description="Cap on retries after retryable failures; default: the failure policy's",
    )
    array: ArrayMembership | None = Field(
        default=None, description="The job array this job belongs to, if any"
    )
    after_ok: Dependencies = Field(
        default=(),
        description="Job ids of the same user's jobs that must complete successfully before "
        "this one may run; it is cancelled if one fails or is cancelled",
    )
    prepare: bool = Field(
        default=False,
        description="The job calls `Job.from_env()` before touching any GPU: its process may "
        "start before it is given GPUs (a prepared start: it imports its framework while it "
        "waits, parked, and its first slice begins with its first mini-batch)",
    )

    @model_validator(mode="after")
    def _batch(self) -> Self:
        if self.job_id in self.after_ok:
            raise ValueError(f"after_ok: job {self.job_id} cannot wait for itself")
        if self.array is not None and len(self.env) > MAX_ENV_VARS - 2:
            raise ValueError(f"env: an array member has room for {MAX_ENV_VARS - 2} variables")
        if self.array is not None:
            expected = member_job_id(self.array.id, self.array.index)
            if self.job_id != expected:
                raise ValueError(
                    f"job_id: an array member's id is <array id>-<index>, {expected!r}, "
                    f"not {self.job_id!r}"
                )
        return self

    def subject(self) -> str:
        return submit_subject(self.user)

    @classmethod
    def subject_pattern(cls) -> str:
        return f"{PREFIX}.submit.*"


@register
class JobCancelRequested(JobEvent):
    """A request to cancel one of `user`'s jobs; published by tools on `gfair.cancel.<user>`."""

    EVENT_TYPE = "gfair.job.cancel_requested.v1"

    reason: Reason | None = None

    def subject(self) -> str:
        return cancel_subject(self.user)

    @classmethod
    def subject_pattern(cls) -> str:
        return f"{PREFIX}.cancel.*"
