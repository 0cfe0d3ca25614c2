"""How fast a job progresses on each GPU generation, in V100-equivalent seconds per second.

A trace gives each job's run time on a V100 (`duration_s`), so a job's work is that many
V100-seconds; on generation G it advances at ``rate(type, G) / rate(type, v100)`` of V100 speed,
from the Gavel 1-GPU measurements. A multi-GPU gang is assumed to scale like its 1-GPU rate (the
trace's duration already is the gang's run time); a gang spanning generations runs at the pace
of its slowest member.

Jobs without a known type (all of Philly) and generations Gavel did not measure use the core's
`DEFAULT_SPEEDS` (geometric means over the Gavel job types for K80, P100 and V100: a K80 does
about 0.30 and a P100 about 0.94 of a V100's work), normalised to the V100, so the simulated
"truth" for an unknown job is exactly what the scheduler assumes before it profiles anything.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from gfair.core.cluster import generation_rank
from gfair.core.throughput import DEFAULT_SPEEDS, UNKNOWN_GENERATION_SPEED

REFERENCE_GENERATION: Final = "v100"


class UnknownJobType(KeyError):
    """A job names a type the speed table does not know."""


@dataclass(frozen=True)
class SpeedModel:
    """Relative speeds: `by_type[job_type][generation]` and `default[generation]`."""

    by_type: Mapping[str, Mapping[str, float]]
    default: Mapping[str, float]
    _cache: dict[tuple[str | None, str], float] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _ranked: dict[tuple[str | None, tuple[str, ...]], tuple[str, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def from_rates(cls, rates: Mapping[str, Mapping[str, float]]) -> SpeedModel:
        """Build from measured 1-GPU rates (`rates[job_type][generation]`, any unit).

        Types with no positive V100 rate cannot be normalised and are left out; a zero rate on
        another generation (the job did not fit there) is left out for that generation.
        """
        by_type: dict[str, Mapping[str, float]] = {}
        for job_type, per_generation in rates.items():
            reference = per_generation.get(REFERENCE_GENERATION, 0.0)
            if not reference > 0:
                continue
            by_type[job_type] = MappingProxyType(
                {
                    generation: rate / reference
                    for generation, rate in per_generation.items()
                    if rate > 0 and math.isfinite(rate)
                }
            )
        reference = DEFAULT_SPEEDS[REFERENCE_GENERATION]
        default = {g: speed / reference for g, speed in DEFAULT_SPEEDS.items()}
        return cls(by_type=MappingProxyType(by_type), default=MappingProxyType(default))

    @property
    def job_types(self) -> tuple[str, ...]:
        return tuple(self.by_type)

    def check(self, job_type: str | None) -> None:
        """Raise `UnknownJobType` unless `job_type` is empty or in the table."""
        if job_type is not None and job_type not in self.by_type:
            raise UnknownJobType(job_type)

    @property
    def unknown_generation(self) -> float:
        return UNKNOWN_GENERATION_SPEED / DEFAULT_SPEEDS[REFERENCE_GENERATION]

    def speed(self, job_type: str | None, generation: str) -> float:
        """V100-seconds of work done per second on one `generation` gang."""
        key = (job_type, generation)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        measured = self.by_type.get(job_type, {}) if job_type is not None else {}
        value = measured.get(generation) or self.default.get(generation, self.unknown_generation)
        self._cache[key] = value
        return value

    def gang_speed(self, job_type: str | None, generations: Iterable[str]) -> float:
        return min(self.speed(job_type, generation) for generation in generations)

    def fastest(self, job_type: str | None, generations: Iterable[str]) -> float:
        """The best speed over `generations` (for a job's ideal run time)."""
        return max(self.speed(job_type, generation) for generation in generations)

    def ranked(self, job_type: str | None, generations: tuple[str, ...]) -> tuple[str, ...]:
        """`generations` from the fastest for `job_type` to the slowest (ties: newer first)."""
        key = (job_type, generations)
        ranked = self._ranked.get(key)
        if ranked is None:
            ranked = tuple(
                sorted(
                    generations,
                    key=lambda g: (-self.speed(job_type, g), -generation_rank(g)[0], g),
                )
            )
            self._ranked[key] = ranked
        return ranked
