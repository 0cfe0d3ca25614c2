"""Accounting read from job records: each job's times and GPU-hours (`gfair history`), and each
user's GPU-hours over recent windows and decayed with a half-life (`gfair usage`).

A record keeps its GPU-seconds per generation as totals, not as the list of its time slices
(a job time-sliced every minute for a week would hold ten thousand of them). Windows and decay
therefore place that time on the clock as follows: the interval running now (if any) exactly,
from its start; the rest spread evenly from the job's first start to where it last stopped
running (its end, the start of the current interval, or its last change). Over windows much
longer than a quantum this is close; for a job that ran in bursts it smooths the bursts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gfair.events.states import JobState
from gfair.state.job_record import JobRecord

HOUR_S = 3600.0


@dataclass(frozen=True)
class HistoryLine:
    """One line of `gfair history`."""

    user: str
    job_id: str
    state: JobState
    gpus: int
    generation: str | None
    submitted_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    gpu_hours: dict[str, float]
    reason: str | None

    @property
    def wait_s(self) -> float | None:
        """Submission to first start (None if it never ran)."""
        if self.started_at is None:
            return None
        return (self.started_at - self.submitted_at).total_seconds()

    def runtime_s(self, now: datetime) -> float | None:
        """First start to its end (or to `now` while it lives), suspended time included."""
        if self.started_at is None:
            return None
        return ((self.ended_at or now) - self.started_at).total_seconds()

    @property
    def held_s(self) -> float:
        """Seconds its processes held its GPUs: without the time it waited suspended or in a
        retry's back-off, which `runtime_s` counts."""
        return sum(self.gpu_hours.values()) * HOUR_S / self.gpus if self.gpus else 0.0


def account(record: JobRecord, now: datetime) -> HistoryLine:
    return HistoryLine(
        user=record.user,
        job_id=record.job_id,
        state=record.state,
        gpus=record.gpus,
        generation=record.generation,
        submitted_at=record.submission.submitted_at,
        started_at=record.accounting.started_at,
        ended_at=record.ended_at,
        gpu_hours={g: s / HOUR_S for g, s in sorted(record.gpu_seconds(now).items())},
        reason=record.reason,
    )


def selected(
    records: Iterable[JobRecord],
    *,
    users: Sequence[str] = (),
    states: Sequence[JobState] = (),
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[JobRecord]:
    """Records of `users` in `states` that lived at some time in [since, until], by submission.

    A job lives from its submission to its end (still living: to now), as sacct's -S/-E.
    """
    found = []
    for record in records:
        if users and record.user not in users:
            continue
        if states and record.state not in states:
            continue
        if until is not None and record.submission.submitted_at > until:
            continue
        ended = record.ended_at
        if since is not None and ended is not None and ended < since:
            continue
        found.append(record)
    return sorted(found, key=lambda r: (r.submission.submitted_at, r.user, r.job_id))


@dataclass(frozen=True)
class _Piece:
    """GPU-seconds spread evenly over [start, end]."""

    start: float
    end: float
    gpu_seconds: float

    def within(self, since: float, until: float) -> float:
        if self.end <= self.start:
            return self.gpu_seconds if since <= self.end <= until else 0.0
        overlap = min(self.end, until) - max(self.start, since)
        return self.gpu_seconds * max(overlap, 0.0) / (self.end - self.start)

    def decayed(self, now: float, half_life_s: float) -> float:
        """The integral over the piece of rate * 2^-((now - t) / half-life) dt, at an even rate."""
        if self.end <= self.start:
            return self.gpu_seconds * math.pow(2.0, -(now - self.end) / half_life_s)
        rate = self.gpu_seconds / (self.end - self.start)
        tau = half_life_s / math.log(2.0)
        late, early = math.exp(-(now - self.end) / tau), math.exp(-(now - self.start) / tau)
        return rate * tau * (late - early)


def _pieces(record: JobRecord, now: datetime) -> list[_Piece]:
    accounting = record.accounting
    if accounting.started_at is None:
        return []
    first = accounting.started_at.timestamp()
    closed = sum(accounting.gpu_seconds.values())
    pieces = []
    if accounting.running_since is not None:
        since = accounting.running_since.timestamp()
        end = (record.ended_at or now).timestamp()
        pieces.append(_Piece(since, end, max(end - since, 0.0) * record.gpus))
        if closed:
            pieces.append(_Piece(first, since, closed))
    elif closed:
        last = (record.ended_at or record.updated_at).timestamp()
        pieces.append(_Piece(first, last, closed))
    return pieces


@dataclass
class UserUsage:
    """One line of `gfair usage`."""

    user: str
    jobs: int = 0
    running: int = 0
    gpu_hours: dict[str, float] = field(default_factory=dict)  # all time, per generation
    windows: dict[float, float] = field(default_factory=dict)  # window (s) -> GPU-hours
    decayed_gpu_hours: float = 0.0
    decayed_share: float = 0.0  # of every user's decayed usage

    @property
    def total_gpu_hours(self) -> float:
        return sum(self.gpu_hours.values())


def usage(
    records: Iterable[JobRecord],
    now: datetime,
    *,
    windows_s: Sequence[float],
    half_life_s: float,
) -> list[UserUsage]:
    """Per user, by user name: GPU-hours all time, over each window ending `now`, and decayed."""
    if half_life_s <= 0:
        raise ValueError(f"half-life must be > 0, got {half_life_s}")
    by_user: dict[str, UserUsage] = {}
    moment = now.timestamp()
    for record in records:
        line = by_user.setdefault(record.user, UserUsage(record.user))
        line.jobs += 1
        line.running += record.state is JobState.RUNNING
        for generation, seconds in record.gpu_seconds(now).items():
            line.gpu_hours[generation] = line.gpu_hours.get(generation, 0.0) + seconds / HOUR_S
        pieces = _pieces(record, now)
        for window in windows_s:
            held = sum(p.within(moment - window, moment) for p in pieces)
            line.windows[window] = line.windows.get(window, 0.0) + held / HOUR_S
        line.decayed_gpu_hours += sum(p.decayed(moment, half_life_s) for p in pieces) / HOUR_S
    total = sum(u.decayed_gpu_hours for u in by_user.values())
    for line in by_user.values():
        line.decayed_share = line.decayed_gpu_hours / total if total > 0 else 0.0
        for window in windows_s:
            line.windows.setdefault(window, 0.0)
    return [by_user[name] for name in sorted(by_user)]


_UNITS = {"s": 1.0, "m": 60.0, "h": HOUR_S, "d": 86_400.0, "w": 7 * 86_400.0}


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``15m``, ``2h``, ``7d``, ``1w``; `ValueError` otherwise."""
    word = text.strip().lower()
    scale = _UNITS.get(word[-1:])
    number = word[:-1] if scale is not None else word
    try:
        value = float(number) * (scale or 1.0)
    except ValueError:
        raise ValueError(f"{text!r}: expected a duration such as 90s, 15m, 2h, 7d or 1w") from None
    if not value > 0 or math.isinf(value):
        raise ValueError(f"{text!r}: a duration must be > 0")
    return value


def format_duration(seconds: float) -> str:
    """The shortest of ``45s``, ``12m``, ``3h``, ``7d``, ``2w`` that says `seconds` exactly,
    else seconds."""
    for unit in ("w", "d", "h", "m"):
        scale = _UNITS[unit]
        if seconds >= scale and seconds % scale == 0:
            return f"{seconds / scale:g}{unit}"
    return f"{seconds:g}s"
