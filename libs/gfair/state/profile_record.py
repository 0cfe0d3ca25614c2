"""What the profiler keeps in `gfair_profiles` (its only writer; docs/design.md §2.4).

Keys:

- ``type.<user>.<type key>`` -> `TypeProfileRecord`: the measured speed of one user's jobs of one
  job type on each GPU generation, and the estimate published from it. The slides assume a user
  submits one type of job, so its jobs of a type stand for each other (`type_key` below).
- ``job.<user>.<job_id>`` -> `JobProfileRecord`: one live job's own measurements and what folding
  its progress reports needs (its GPUs, type and the last report folded in), and its switches
  (`SwitchSamples`: the last few suspends, in-place resumes and cold starts its nodes measured,
  and the estimate last published from them). Deleted when the job ends.
- ``generations`` -> `GenerationsRecord`: the GPU generations the cluster has offered so far.

Rates are mini-batches per second *per GPU* (a gang's rate divided by its GPUs), the unit of
the 1-GPU seed table, so that 1-GPU and 8-GPU jobs of a user can be pooled. Only ratios between
generations drive scheduling.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime

from pydantic import Field

from gfair.events.fields import Bytes, Generation, GpuCount, JobId, Name, Seconds, UserName
from gfair.state.record import Record

GENERATIONS_KEY = "generations"
_NOT_IN_KEY = re.compile(r"[^A-Za-z0-9-]+")
_UNTYPED = "untyped"


def type_key(job_type: str | None) -> str:
    """A key token for a job type: readable stem plus a digest, so distinct types never collide.

    Job types are free text ("ResNet-50 (batch size 32)"); bucket keys allow few characters.
    """
    if job_type is None:
        return _UNTYPED
    stem = _NOT_IN_KEY.sub("-", job_type).strip("-")[:40] or "type"
    digest = hashlib.sha256(job_type.encode()).hexdigest()[:10]
    return f"{stem}-{digest}"


def type_profile_key(user: str, job_type: str | None) -> str:
    return f"type.{user}.{type_key(job_type)}"


def job_profile_key(user: str, job_id: str) -> str:
    return f"job.{user}.{job_id}"


class Measurement(Record):
    """An exponentially weighted mean of observed per-GPU rates on one generation."""

    rate: float = Field(ge=0, allow_inf_nan=False, description="Mini-batches/s per GPU")
    samples: int = Field(ge=1)


class PublishedProfile(Record):
    """The estimate last published in a `ProfileUpdated`, kept to throttle the next one."""

    rates: dict[Generation, float] = Field(description="Per-GPU mini-batches/s, all generations")
    baseline: Generation
    speedups: dict[Generation, float]
    observed: tuple[Generation, ...] = ()
    at: datetime
    # The event whose handling published it: a redelivery of that event publishes it again
    # (under the same derived event id, so JetStream keeps one copy).
    cause_id: str | None = None


class SwitchEstimate(Record):
    """The switch estimates last published in a `SwitchCostsUpdated` (medians; None: never
    measured), kept to throttle the next one and for `gfair job`."""

    reports: int = Field(ge=1)
    yield_s: Seconds | None = None
    resume_in_place_s: Seconds | None = None
    cold_start_s: Seconds | None = None
    checkpoint_bytes: Bytes | None = None
    at: datetime
    cause_id: str | None = None  # as `PublishedProfile.cause_id`


class SwitchSamples(Record):
    """A job's last measured switches of each kind, oldest first (the profiler keeps a few).

    `folded` names the reports folded in last: a redelivery of one is not counted again.
    Reports are told apart by event id, not by position as progress is: a suspend carries no
    step, and a new process's first report may lie before the last one folded (a forced yield
    loses the steps since its checkpoint).
    """

    yields: tuple[Seconds, ...] = ()
    resumes_in_place: tuple[Seconds, ...] = ()
    cold_starts: tuple[Seconds, ...] = ()
    checkpoint_bytes: Bytes | None = None
    reports: int = Field(default=0, ge=0, description="Switch reports folded in, in all")
    folded: tuple[str, ...] = ()
    published: SwitchEstimate | None = None


class TypeProfileRecord(Record):
    user: UserName
    job_type: Name | None = None
    measured: dict[Generation, Measurement] = Field(default_factory=dict)
    published: PublishedProfile | None = None
    updated_at: datetime


class JobProfileRecord(Record):
    user: UserName
    job_id: JobId
    job_type: Name | None = None
    gpus: GpuCount
    measured: dict[Generation, Measurement] = Field(default_factory=dict)
    # Progress reports are folded in at most once: a report is new only if its (attempt,
    # iterations) is past the last one folded (they grow within an attempt and across attempts).
    last_attempt: int = Field(default=0, ge=0)
    last_iterations: int = Field(default=-1, ge=-1)
    last_event_id: str | None = None
    published: PublishedProfile | None = None
    switches: SwitchSamples = Field(default_factory=SwitchSamples)
    updated_at: datetime


class GenerationsRecord(Record):
    generations: tuple[Generation, ...] = ()
    # The node registration that added the last ones (see `PublishedProfile.cause_id`).
    cause_id: str | None = None
