"""The profiler's view: every live job's and every (user, job type)'s measured speeds.

Measurements go into the core's `ThroughputEstimator` (seeded from the Gavel table), which
layers them over the seed (docs/design.md §2.4). The book turns its estimates into `ProfileUpdated`
payloads and decides when one is worth publishing: when a generation appears that the last one
did not cover (a new pool, or a first measurement on a generation), or when a speedup moved by
more than `change` (default 5%) since.

It also keeps each job's switch estimates (`switch_estimates`): its suspends, in-place resumes
and new processes' first mini-batches, published as `SwitchCostsUpdated` when they moved.

Records mirror the book one to one (`gfair.state.profile_record`), so a restarted profiler
restores it from its bucket. No I/O and no clock here: the service writes the records and
passes times in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from gfair.core.cluster import generation_rank
from gfair.core.throughput import ThroughputEstimator, ThroughputTable
from gfair.events.jobs import JobProgress, JobResumed, JobSuspended
from gfair.events.scheduling import ProfileUpdated, SwitchCostsUpdated
from gfair.state.profile_record import (
    JobProfileRecord,
    Measurement,
    PublishedProfile,
    TypeProfileRecord,
)
from gfair_services.profiler import switch_estimates

TypeId = tuple[str, str | None]  # (user, job type)
R = TypeVar("R", TypeProfileRecord, JobProfileRecord)
JobKey = tuple[str, str]  # (user, job id)


@dataclass(frozen=True)
class Fold:
    """What folding one report changed: records to write, profiles and costs to publish."""

    job: JobProfileRecord
    kind: TypeProfileRecord | None = None
    profiles: tuple[ProfileUpdated, ...] = ()
    costs: SwitchCostsUpdated | None = None


@dataclass
class Republished:
    records: list[TypeProfileRecord] = field(default_factory=list)
    profiles: list[ProfileUpdated] = field(default_factory=list)


def _estimator_job(user: str, job_id: str) -> str:
    # Job ids are unique per user only; the estimator keys jobs by one string.
    return f"{user}/{job_id}"


def profile_event(
    record: TypeProfileRecord | JobProfileRecord, published: PublishedProfile
) -> ProfileUpdated:
    return ProfileUpdated(
        user=record.user,
        job_id=record.job_id if isinstance(record, JobProfileRecord) else None,
        job_type=record.job_type,
        rates=published.rates,
        baseline=published.baseline,
        speedups=published.speedups,
        observed=published.observed,
    )


class ProfileBook:
    def __init__(self, table: ThroughputTable, *, alpha: float = 0.3, change: float = 0.05) -> None:
        if not change > 0:
            raise ValueError(f"change must be > 0, got {change}")
        self.table = table
        self.change = change
        self.estimator = ThroughputEstimator(table, alpha=alpha)
        self.jobs: dict[JobKey, JobProfileRecord] = {}
        self.types: dict[TypeId, TypeProfileRecord] = {}
        self.generations: set[str] = set()
        # The node registration that last added generations (replays publish its profiles).
        self.generations_cause: str | None = None

    # -- restore --------------------------------------------------------------------------

    def restore(
        self,
        types: Iterable[TypeProfileRecord],
        jobs: Iterable[JobProfileRecord],
        generations: Iterable[str],
        generations_cause: str | None = None,
    ) -> None:
        self.generations_cause = generations_cause
        self.types = {(t.user, t.job_type): t for t in types}
        self.jobs = {(j.user, j.job_id): j for j in jobs}
        self.generations = set(generations)
        self.estimator.restore(
            {
                "jobs": {
                    _estimator_job(j.user, j.job_id): _rates(j.measured) for j in self.jobs.values()
                },
                "users": [
                    {"user": t.user, "job_type": t.job_type, "rates": _rates(t.measured)}
                    for t in self.types.values()
                ],
            }
        )

    # -- jobs -----------------------------------------------------------------------------

    def admit(
        self, user: str, job_id: str, job_type: str | None, gpus: int, now: datetime
    ) -> JobProfileRecord | None:
        """Start tracking a job; None when it is tracked already (a repeated acceptance)."""
        if (user, job_id) in self.jobs:
            return None
        record = JobProfileRecord(
            user=user, job_id=job_id, job_type=job_type, gpus=gpus, updated_at=now
        )
        self.jobs[user, job_id] = record
        return record

    def forget(self, user: str, job_id: str) -> bool:
        """Drop a finished job's own measurements (its user's stay); False if unknown."""
        if self.jobs.pop((user, job_id), None) is None:
            return False
        self.estimator.forget_job(_estimator_job(user, job_id))
        return True

    def job(self, user: str, job_id: str) -> JobProfileRecord | None:
        return self.jobs.get((user, job_id))

    def replay(self, user: str, job_id: str, event_id: str) -> Fold | None:
        """The fold an already-handled report made, to write and publish again; None if not."""
        job = self.jobs.get((user, job_id))
        if job is None:
            return None
        progressed = job.last_event_id == event_id
        if not progressed and event_id not in job.switches.folded:
            return None
        kind = self.types.get((user, job.job_type)) if progressed else None
        profiles = [
            profile_event(r, r.published)
            for r in (kind, job)
            if r is not None and r.published is not None and r.published.cause_id == event_id
        ]
        published = job.switches.published
        costs = (
            switch_estimates.costs_event(job, published)
            if published is not None and published.cause_id == event_id
            else None
        )
        return Fold(job, kind, tuple(profiles), costs)

    def switched(
        self, report: JobSuspended | JobResumed, event_id: str, now: datetime
    ) -> Fold | None:
        """Fold one suspend or resume in; None when the job is unknown or it measured nothing
        new."""
        job = self.jobs.get((report.user, report.job_id))
        if job is None:
            return None
        folded = self._switch(job, report, event_id, now)
        if folded is None:
            return None
        job, costs = folded
        self.jobs[job.user, job.job_id] = job
        return Fold(job, costs=costs)

    def _switch(
        self,
        job: JobProfileRecord,
        report: switch_estimates.SwitchReport,
        event_id: str,
        now: datetime,
    ) -> tuple[JobProfileRecord, SwitchCostsUpdated | None] | None:
        samples = switch_estimates.fold(job.switches, report, event_id)
        if samples is None:
            return None
        costs = None
        estimate = switch_estimates.estimate(samples, event_id, now)
        if estimate is not None and switch_estimates.moved(
            samples.published, estimate, self.change
        ):
            samples = samples.model_copy(update={"published": estimate})
            costs = switch_estimates.costs_event(job, estimate)
        return job.model_copy(update={"switches": samples, "updated_at": now}), costs

    def observe(self, progress: JobProgress, event_id: str, now: datetime) -> Fold | None:
        """Fold one progress report in; None when it is unknown, stale or says nothing."""
        job = self.jobs.get((progress.user, progress.job_id))
        if job is None:
            return None
        # A new process's first report measures its cold start, even when its steps lie before
        # the last report folded (a forced yield lost the steps since its checkpoint).
        costs = None
        switched = self._switch(job, progress, event_id, now)
        if switched is not None:
            job, costs = switched
        position = (progress.attempt, progress.iterations)
        if position <= (job.last_attempt, job.last_iterations):
            if switched is None:
                return None
            self.jobs[progress.user, progress.job_id] = job
            return Fold(job, costs=costs)
        generation = progress.generation
        rate = progress.minibatches_per_s / job.gpus
        updates = {
            "last_attempt": progress.attempt,
            "last_iterations": progress.iterations,
            "last_event_id": event_id,
            "updated_at": now,
        }
        if not rate > 0:
            # Warm-up or a stall: no information about speed, but the report is used up.
            job = job.model_copy(update=updates)
            self.jobs[progress.user, progress.job_id] = job
            return Fold(job, costs=costs)
        self.estimator.observe(
            _estimator_job(job.user, job.job_id), job.user, job.job_type, generation, rate
        )
        key = (job.user, job.job_type)
        kind = self.types.get(key) or TypeProfileRecord(
            user=job.user, job_type=job.job_type, updated_at=now
        )
        kind = kind.model_copy(
            update={"measured": self._measure(kind.measured, generation, rate), "updated_at": now}
        )
        job = job.model_copy(
            update={**updates, "measured": self._measure(job.measured, generation, rate)}
        )
        profiles: list[ProfileUpdated] = []
        kind, published = self._publish_if_moved(kind, event_id, now)
        if published is not None:
            profiles.append(published)
        job, published = self._publish_if_moved(job, event_id, now)
        if published is not None:
            profiles.append(published)
        self.types[key] = kind
        self.jobs[job.user, job.job_id] = job
        return Fold(job, kind, tuple(profiles), costs)

    # -- generations ----------------------------------------------------------------------

    def offer(self, generations: Iterable[str], event_id: str, now: datetime) -> Republished:
        """Generations a node offers; profiles that now cover more generations are republished."""
        new = set(generations) - self.generations
        outcome = Republished()
        if not new:
            return outcome
        self.generations |= new
        self.generations_cause = event_id
        for key in sorted(self.types, key=lambda k: (k[0], k[1] or "")):
            kind, published = self._publish_if_moved(self.types[key], event_id, now)
            if published is not None:
                self.types[key] = kind
                outcome.records.append(kind)
                outcome.profiles.append(published)
        return outcome

    def republished(self, event_id: str) -> Republished:
        """The type profiles an already-handled node offer published, to publish again."""
        outcome = Republished()
        for key in sorted(self.types, key=lambda k: (k[0], k[1] or "")):
            kind = self.types[key]
            if kind.published is not None and kind.published.cause_id == event_id:
                outcome.records.append(kind)
                outcome.profiles.append(profile_event(kind, kind.published))
        return outcome

    # -- estimates ------------------------------------------------------------------------

    def estimate(self, record: TypeProfileRecord | JobProfileRecord) -> PublishedProfile | None:
        """The profile of a record over every known generation, in per-GPU mini-batches/s."""
        generations = sorted(self.generations | set(record.measured), key=generation_rank)
        if isinstance(record, JobProfileRecord):
            speeds = self.estimator.job_speeds(
                _estimator_job(record.user, record.job_id),
                record.user,
                record.job_type,
                generations,
            )
        else:
            speeds = self.estimator.type_speeds(record.user, record.job_type, generations)
        rates = self._in_rate_units(speeds, record)
        moving = [g for g in generations if rates[g] > 0]
        if not moving:
            return None
        baseline = moving[0]  # the slowest generation it runs on
        return PublishedProfile(
            rates=rates,
            baseline=baseline,
            speedups={g: rates[g] / rates[baseline] for g in moving},
            observed=tuple(g for g in generations if g in record.measured),
            at=record.updated_at,
        )

    def _in_rate_units(
        self, speeds: Mapping[str, float], record: TypeProfileRecord | JobProfileRecord
    ) -> dict[str, float]:
        # The estimator's speeds are relative; scale them to what was measured (else to the
        # seed) so that the published rates read as mini-batches per second per GPU.
        anchor = _rates(record.measured)
        if not any(anchor.get(g, 0) > 0 and s > 0 for g, s in speeds.items()):
            anchor = dict(self.table.get(record.job_type, {})) if record.job_type else {}
        logs = [
            math.log(anchor[g] / s) for g, s in speeds.items() if s > 0 and anchor.get(g, 0) > 0
        ]
        scale = math.exp(sum(logs) / len(logs)) if logs else 1.0
        return {g: s * scale for g, s in speeds.items()}

    def _measure(
        self, measured: Mapping[str, Measurement], generation: str, rate: float
    ) -> dict[str, Measurement]:
        # The same weighted mean the estimator keeps, recorded so a restart restores it.
        out = dict(measured)
        old = out.get(generation)
        if old is None:
            out[generation] = Measurement(rate=rate, samples=1)
        else:
            mean = old.rate + self.estimator.alpha * (rate - old.rate)
            out[generation] = Measurement(rate=mean, samples=old.samples + 1)
        return out

    def _publish_if_moved(
        self, record: R, event_id: str, now: datetime
    ) -> tuple[R, ProfileUpdated | None]:
        estimate = self.estimate(record)
        if estimate is None or not self._moved(record.published, estimate):
            return record, None
        estimate = estimate.model_copy(update={"cause_id": event_id, "at": now})
        record = record.model_copy(update={"published": estimate})
        return record, profile_event(record, estimate)

    def _moved(self, old: PublishedProfile | None, new: PublishedProfile) -> bool:
        if old is None or old.baseline != new.baseline:
            return True
        if set(new.rates) - set(old.rates) or set(new.observed) - set(old.observed):
            return True
        for generation, speedup in new.speedups.items():
            before = old.speedups.get(generation)
            if before is None or abs(speedup / before - 1) > self.change:
                return True
        return False


def _rates(measured: Mapping[str, Measurement]) -> dict[str, float]:
    return {g: m.rate for g, m in measured.items()}
