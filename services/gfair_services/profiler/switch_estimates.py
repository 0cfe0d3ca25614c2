"""A job's switch estimates: its nodes' switch reports folded into `SwitchSamples`, and when
the estimates are worth publishing (`SwitchCostsUpdated`, docs/design.md §2.4).

What is measured (the node executor's reports, `gfair.events.jobs`): a suspend's `duration_s`
(the yield: command to GPUs free) and `checkpoint_bytes`; an in-place resume's `duration_s`
(command to its first new mini-batch); a new process's first progress report's `first_step_s`
(the cold start: start command to first mini-batch). Each estimate is the median of the last
`WINDOW` of its kind, so one stall (a slow file system, a busy host) moves it by one place among
the samples, not by the stall's length, and a job whose switches got dearer (a checkpoint
grown) is charged so within a few.

An estimate is published again when a kind is measured for the first time, or one moved by more
than `change` of its last published value and by more than `RESOLUTION_S` (smaller differences
change no decision: quanta last seconds to minutes), or the checkpoint's size by more than
`change`. No I/O and no clock here.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from datetime import datetime
from typing import Final

from gfair.events.jobs import JobProgress, JobResumed, JobSuspended
from gfair.events.scheduling import SwitchCostsUpdated
from gfair.state.profile_record import JobProfileRecord, SwitchEstimate, SwitchSamples

WINDOW: Final = 5  # samples of each kind an estimate is the median of
REMEMBERED: Final = 16  # report ids kept to recognise a redelivery
RESOLUTION_S: Final = 0.1

SwitchReport = JobSuspended | JobResumed | JobProgress


def fold(samples: SwitchSamples, report: SwitchReport, event_id: str) -> SwitchSamples | None:
    """`samples` with `report` folded in; None when it measured no switch or was folded
    already."""
    if event_id in samples.folded:
        return None
    update: dict[str, object] = {}
    if isinstance(report, JobSuspended):
        if report.duration_s is not None:
            update["yields"] = _kept(samples.yields, report.duration_s)
        if report.checkpoint_bytes is not None:
            update["checkpoint_bytes"] = report.checkpoint_bytes
    elif isinstance(report, JobResumed):
        # A resume not in place starts a new process: its first progress report measures it.
        if report.in_place and report.duration_s is not None:
            update["resumes_in_place"] = _kept(samples.resumes_in_place, report.duration_s)
    elif report.first_step_s is not None:
        update["cold_starts"] = _kept(samples.cold_starts, report.first_step_s)
    if not update:
        return None
    update["reports"] = samples.reports + 1
    update["folded"] = (*samples.folded, event_id)[-REMEMBERED:]
    return samples.model_copy(update=update)


def estimate(samples: SwitchSamples, cause_id: str, now: datetime) -> SwitchEstimate | None:
    """The estimates of `samples` (None before any switch was measured)."""
    if samples.reports == 0:
        return None
    return SwitchEstimate(
        reports=samples.reports,
        yield_s=_median(samples.yields),
        resume_in_place_s=_median(samples.resumes_in_place),
        cold_start_s=_median(samples.cold_starts),
        checkpoint_bytes=samples.checkpoint_bytes,
        at=now,
        cause_id=cause_id,
    )


def moved(old: SwitchEstimate | None, new: SwitchEstimate, change: float) -> bool:
    """Whether `new` differs from what was last published enough to publish it (module doc)."""
    if old is None:
        return True
    pairs = (
        (old.yield_s, new.yield_s),
        (old.resume_in_place_s, new.resume_in_place_s),
        (old.cold_start_s, new.cold_start_s),
    )
    for before, after in pairs:
        if before is None or after is None:
            if before is not after:
                return True
        elif abs(after - before) > max(change * before, RESOLUTION_S):
            return True
    before_bytes, after_bytes = old.checkpoint_bytes, new.checkpoint_bytes
    if before_bytes is None or after_bytes is None:
        return before_bytes is not after_bytes
    return abs(after_bytes - before_bytes) > change * before_bytes


def costs_event(job: JobProfileRecord, published: SwitchEstimate) -> SwitchCostsUpdated:
    return SwitchCostsUpdated(
        user=job.user,
        job_id=job.job_id,
        reports=published.reports,
        yield_s=published.yield_s,
        resume_in_place_s=published.resume_in_place_s,
        cold_start_s=published.cold_start_s,
        checkpoint_bytes=published.checkpoint_bytes,
    )


def _kept(samples: Sequence[float], sample: float) -> tuple[float, ...]:
    return (*samples, sample)[-WINDOW:]


def _median(samples: Sequence[float]) -> float | None:
    return statistics.median(samples) if samples else None
