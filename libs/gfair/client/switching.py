"""What a job's switches cost, read from its events, and what the scheduler charges it for
them: for `gfair job`.

Each suspend says how long until its GPUs were free (`duration_s`) and whether it parked in
place; each in-place resume how long until its first new mini-batch; a new process's first
progress report how long from its start command to its first mini-batch; suspends that wrote a
checkpoint, its size. The profiler estimates the same from the job's last few switches (its
`SwitchEstimate`, published to split-stride), and split-stride charges the job from those
(`gfair.core.switch_costs.MeasuredSwitches.charged`): `describe_charges` says what.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from gfair.bus.history import HistoricalEvent
from gfair.core.switch_costs import MeasuredSwitches
from gfair.core.switch_costs import SwitchCosts as ChargedCosts
from gfair.events.jobs import JobExited, JobProgress, JobResumed, JobStarted, JobSuspended
from gfair.state.profile_record import SwitchEstimate

# Operator costs of nothing: the charges as measured, before the operator's settings count.
_UNSET = ChargedCosts(resume_s=0.0, migration_s=0.0)


@dataclass(frozen=True, slots=True)
class SwitchStats:
    suspends: int
    in_place: int
    yield_p50_s: float | None
    resume_in_place_p50_s: float | None
    cold_start_p50_s: float | None
    checkpoint_bytes: int | None  # the last suspend's checkpoint that said its size

    @classmethod
    def of(cls, events: Iterable[HistoricalEvent]) -> SwitchStats:
        yields: list[float] = []
        resumes: list[float] = []
        cold: list[float] = []
        suspends = in_place = 0
        size: int | None = None
        for event in events:
            data = event.data
            if isinstance(data, JobSuspended):
                suspends += 1
                in_place += data.in_place
                if data.duration_s is not None:
                    yields.append(data.duration_s)
                if data.checkpoint_bytes is not None:
                    size = data.checkpoint_bytes
            elif isinstance(data, JobResumed) and data.in_place and data.duration_s is not None:
                resumes.append(data.duration_s)
            elif isinstance(data, JobProgress) and data.first_step_s is not None:
                cold.append(data.first_step_s)
        return cls(suspends, in_place, _median(yields), _median(resumes), _median(cold), size)

    def describe(self) -> str:
        timings = _timings(
            (self.yield_p50_s, self.resume_in_place_p50_s, self.cold_start_p50_s),
            ("yield p50", "in-place resume p50", "start to first step p50"),
            self.checkpoint_bytes,
        )
        return ", ".join([f"{self.suspends} suspends ({self.in_place} in place)", *timings])


def describe_estimate(estimate: SwitchEstimate) -> str:
    """The profiler's estimates (medians of the job's last few switches of each kind)."""
    timings = _timings(
        (estimate.yield_s, estimate.resume_in_place_s, estimate.cold_start_s),
        ("yield", "in-place resume", "cold start"),
        estimate.checkpoint_bytes,
    )
    return ", ".join(timings) + f" (from {estimate.reports} reports)"


def _timings(
    seconds: tuple[float | None, float | None, float | None],
    names: tuple[str, str, str],
    checkpoint_bytes: int | None,
) -> list[str]:
    """A yield's, an in-place resume's and a cold start's times, each named, then the
    checkpoint's size: those known. A cold start takes seconds; the others, milliseconds."""
    digits = (3, 3, 2)
    known = zip(seconds, names, digits, strict=True)
    parts = [f"{name} {s:.{d}f}s" for s, name, d in known if s is not None]
    if checkpoint_bytes is not None:
        parts.append(f"checkpoint {checkpoint_bytes / 1e6:.1f} MB")
    return parts


def describe_charges(estimate: SwitchEstimate) -> str:
    """What split-stride charges the job for a resume and a move, from `estimate` (by the
    kernel's own rule, `MeasuredSwitches.charged`, over operator costs of 0 that the operator's
    settings then raise): each the operator's setting until its parts are measured, a move
    never less than the operator's."""
    if estimate.yield_s is None:
        return "the operator's costs until a suspend is measured"
    measured = MeasuredSwitches(estimate.yield_s, estimate.resume_in_place_s, estimate.cold_start_s)
    resumes = []
    if estimate.resume_in_place_s is not None:
        in_place = measured.charged(_UNSET, parked=True).resume_s
        resumes.append(f"{in_place:.2f}s in place")
    move = "the operator's cost until a cold start is measured"
    if estimate.cold_start_s is not None:
        cold = measured.charged(_UNSET, parked=False)
        resumes.append(f"{cold.resume_s:.2f}s from its checkpoint")
        move = f"{cold.migration_s:.2f}s, or GFAIR_MIGRATION_COST_S if that is more"
    resume = ", ".join(resumes) or "the operator's cost until a resume is measured"
    return f"resume {resume}; move {move}"


def seconds_held(
    events: Iterable[HistoricalEvent], began: float | None = None, ended: float | None = None
) -> float:
    """Seconds the job's processes held its GPUs, from each start or resume to the suspend or
    exit report that followed, within the window [`began`, `ended`] (Unix times; open where
    None). With `ended`, a run still holding them then counts up to it. A resume is reported
    once it took effect (in place: at its first mini-batch), so its hold began the resume's
    `duration_s` before its report."""
    held, since = 0.0, None
    for event in events:
        at = event.envelope.time.timestamp()
        if isinstance(event.data, JobStarted | JobResumed):
            if isinstance(event.data, JobResumed) and event.data.duration_s is not None:
                at -= event.data.duration_s
            since = at if began is None else max(at, began)
        elif isinstance(event.data, JobSuspended | JobExited) and since is not None:
            held += max(0.0, (at if ended is None else min(at, ended)) - since)
            since = None
    if since is not None and ended is not None:
        held += max(0.0, ended - since)
    return held


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
