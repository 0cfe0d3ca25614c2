"""Throughput estimates: how fast a job (and a user) trains on each GPU generation.

See docs/design.md §2.4.

Estimates are built in layers, general to specific, each refining the one before:

1. `DEFAULT_SPEEDS`, relative speeds per generation for job types nobody measured;
2. the seeded table ``{job_type: {generation: steps_per_s}}`` (1-GPU gavel measurements); a
   zero there means the job type does not fit on that generation;
3. observations of the user's jobs of that type (the slides assume a user submits one type of
   job, so they stand for all of its jobs, including those not yet profiled);
4. observations of the job itself.

Observed rates are exponentially weighted means (`alpha` is the weight of a new observation).
A layer only says something about *ratios* between generations, and only where it covers at
least two of them: the generations it covers take its ratios, scaled so that their geometric mean
stays what the layer below said; the others keep the layer below's values. So one observation
changes nothing (it says nothing about speedups), and observations on K80 and V100 replace the
seeded V100/K80 speedup while P100 stays where the seed put it relative to them.

Speeds are relative (only ratios mean anything). A user's speed profile is the GPU-weighted mean
of the speeds of its active jobs' types, each normalised to its fastest generation; its speedup
of H over L is ``speed[H] / speed[L]`` (the bid it makes when trading, docs/design.md §2.5).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

ThroughputTable = Mapping[str, Mapping[str, float]]

# K80, P100 and V100 are the geometric means over the 26 job types of the gavel table
# (P100/K80 3.17, V100/K80 3.36). The others are rough assumptions for a job type nobody has
# measured: each later generation roughly doubles training speed; unknown generations get 1.0.
DEFAULT_SPEEDS: Mapping[str, float] = MappingProxyType(
    {
        "k80": 1.0,
        "p40": 2.2,
        "p100": 3.17,
        "t4": 2.6,
        "v100": 3.36,
        "a10": 4.0,
        "a100": 7.0,
        "l40s": 8.0,
        "h100": 14.0,
        "h200": 16.0,
        "b200": 28.0,
    }
)
UNKNOWN_GENERATION_SPEED = 1.0
# Profiles are a user's, not a job's: they are filed under a job id no job can have (not a
# subject token) and that job's own layer is dropped at once.
_PROFILE_JOB = "profile:"


def _refine(prior: dict[str, float], layer: Mapping[str, float]) -> dict[str, float]:
    """Take `layer`'s ratios among the generations it shares with `prior` (see module doc)."""
    common = [g for g, v in layer.items() if v > 0 and prior.get(g, 0.0) > 0]
    if len(common) < 2:
        return prior
    log_scale = sum(math.log(prior[g] / layer[g]) for g in common) / len(common)
    scale = math.exp(log_scale)
    refined = dict(prior)
    for g in common:
        refined[g] = layer[g] * scale
    return refined


class ThroughputEstimator:
    def __init__(
        self,
        table: ThroughputTable | None = None,
        *,
        default_speeds: Mapping[str, float] = DEFAULT_SPEEDS,
        alpha: float = 0.3,
    ) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.table: dict[str, dict[str, float]] = {
            job_type: dict(rates) for job_type, rates in (table or {}).items()
        }
        for job_type, rates in self.table.items():
            for generation, rate in rates.items():
                if rate < 0:
                    raise ValueError(f"throughput of {job_type!r} on {generation} is negative")
        self.default_speeds = dict(default_speeds)
        self.alpha = alpha
        self._job_rates: dict[str, dict[str, float]] = {}  # job id -> generation -> rate
        self._user_rates: dict[tuple[str, str | None], dict[str, float]] = {}

    def observe(
        self, job_id: str, user: str, job_type: str | None, generation: str, rate: float
    ) -> None:
        """Fold a measured mini-batch rate (steps/s) of `job_id` on `generation` in."""
        if not rate >= 0 or math.isinf(rate):
            raise ValueError(f"job {job_id}: rate must be a finite number >= 0, got {rate}")
        for rates in (
            self._job_rates.setdefault(job_id, {}),
            self._user_rates.setdefault((user, job_type), {}),
        ):
            old = rates.get(generation)
            rates[generation] = rate if old is None else old + self.alpha * (rate - old)

    def user_rates(self, user: str, job_type: str | None) -> dict[str, float]:
        """The rates measured of `user`'s jobs of `job_type`, per generation measured (what a
        profiler publishes as the user's profile of the type)."""
        return dict(self._user_rates.get((user, job_type), {}))

    def observed(self, job_id: str) -> bool:
        """Whether the job has observations of its own."""
        return job_id in self._job_rates

    def forget_job(self, job_id: str) -> None:
        """Drop the job's own observations (its user's stay)."""
        self._job_rates.pop(job_id, None)

    def fits(self, job_type: str | None, generation: str) -> bool:
        """False only when the seeded table measured zero throughput (does not fit)."""
        if job_type is None or job_type not in self.table:
            return True
        rate = self.table[job_type].get(generation)
        return rate is None or rate > 0

    def type_speeds(
        self, user: str, job_type: str | None, generations: Iterable[str]
    ) -> dict[str, float]:
        """Relative speed per generation for a job of `job_type` of `user` (layers 1-3)."""
        speeds = {g: self.default_speeds.get(g, UNKNOWN_GENERATION_SPEED) for g in generations}
        seeded = self.table.get(job_type) if job_type is not None else None
        if seeded is not None:
            speeds = _refine(speeds, seeded)
            for g in speeds:
                if seeded.get(g) == 0:
                    speeds[g] = 0.0
        observed = self._user_rates.get((user, job_type))
        if observed is not None:
            speeds = _refine(speeds, observed)
        return speeds

    def job_speeds(
        self, job_id: str, user: str, job_type: str | None, generations: Iterable[str]
    ) -> dict[str, float]:
        """Relative speed per generation of one job (all four layers)."""
        speeds = self.type_speeds(user, job_type, generations)
        observed = self._job_rates.get(job_id)
        if observed is not None:
            speeds = _refine(speeds, observed)
        return speeds

    def gang_speeds(
        self,
        job_id: str,
        user: str,
        job_type: str | None,
        gpus: int,
        pool_gpus: Mapping[str, int],
    ) -> dict[str, float]:
        """The job's speed on each pool, as the decision kernel takes it: 0 where its type does
        not fit the generation or its gang is larger than the pool (it never goes there)."""
        speeds = self.job_speeds(job_id, user, job_type, pool_gpus)
        return {
            g: speeds[g] if self.fits(job_type, g) and gpus <= size else 0.0
            for g, size in pool_gpus.items()
        }

    def observe_profile(self, user: str, job_type: str | None, rates: Mapping[str, float]) -> None:
        """Take a user's published profile of a job type (the profiler already averaged it, so
        with `alpha` 1 it replaces the previous one)."""
        for generation, rate in rates.items():
            if rate > 0:
                self.observe(_PROFILE_JOB, user, job_type, generation, rate)
        self.forget_job(_PROFILE_JOB)

    def user_speeds(
        self, user: str, gangs: Mapping[tuple[str | None, int], int], pool_gpus: Mapping[str, int]
    ) -> dict[str, float]:
        """GPU-weighted mean of the speeds of the user's gangs, each normalised to its fastest.

        `gangs` maps each (job type, gang size) of the user's active jobs to the GPUs they ask
        together. A gang counts 0 on a pool it does not fit (its type measured no throughput
        there, or the pool has fewer GPUs than it asks), as `gang_speeds` has it: share there
        is worth nothing to the user, so trading must not buy it. Per-job observations are left
        out on purpose: the user's per-type observations already pool all its jobs, and this
        keeps the cost independent of how many jobs it runs.
        """
        generations = tuple(pool_gpus)
        total = dict.fromkeys(generations, 0.0)
        weight = 0
        for (job_type, size), gpus in gangs.items():
            speeds = self.type_speeds(user, job_type, generations)
            for g, pool in pool_gpus.items():
                if size > pool:
                    speeds[g] = 0.0
            top = max(speeds.values(), default=0.0)
            if top <= 0 or gpus <= 0:
                continue
            for g in generations:
                total[g] += gpus * speeds[g] / top
            weight += gpus
        if weight == 0:
            return self.type_speeds(user, None, generations)
        return {g: v / weight for g, v in total.items()}

    def snapshot(self) -> dict[str, Any]:
        return {
            "jobs": {job: dict(rates) for job, rates in self._job_rates.items()},
            "users": [
                {"user": user, "job_type": job_type, "rates": dict(rates)}
                for (user, job_type), rates in self._user_rates.items()
            ],
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        self._job_rates = {
            str(job): {str(g): float(r) for g, r in rates.items()}
            for job, rates in data["jobs"].items()
        }
        self._user_rates = {
            (str(row["user"]), row["job_type"]): {str(g): float(r) for g, r in row["rates"].items()}
            for row in data["users"]
        }
