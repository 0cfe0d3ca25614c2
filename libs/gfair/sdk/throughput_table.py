"""Measured training throughputs (Gavel's table) as the synthetic job looks them up.

The file is read by `gfair.gavel` (stdlib only, shared with the scheduling core); this module
adds the lookups a job needs: any gang size, clear errors, and newer generations.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from gfair.gavel import ENV_THROUGHPUTS, load_scaled_throughputs

# The table measured K80, P100 and V100 only. For newer generations these are rough speedups
# over a V100 for convolution/transformer training, from vendors' published training results
# (A100 about 2x, H100 about 3x, H200 a little faster again). They are assumptions, not
# measurements: they only make simulated newer GPUs run jobs at a plausible speed; the
# profiler replaces every estimate with observed rates anyway.
ASSUMED_SPEEDUP_OVER_V100: dict[str, float] = {"a100": 2.0, "h100": 3.0, "h200": 3.4}


class ThroughputLookupError(LookupError):
    """The table has no usable number for the job type, generation or gang size asked for."""


@dataclass(frozen=True, slots=True)
class ThroughputTable:
    # (job type, gpus) -> generation -> steps/s when running alone (0.0: does not fit)
    rates: dict[tuple[str, int], dict[str, float]]

    @classmethod
    def load(cls, path: Path | None = None) -> ThroughputTable:
        """The table at `path`, else $GFAIR_THROUGHPUTS, else the one packaged with gfair."""
        try:
            return cls(load_scaled_throughputs(path))
        except FileNotFoundError as exc:
            raise ThroughputLookupError(f"{exc} (or pass --throughputs)") from None
        except ValueError as exc:
            raise ThroughputLookupError(str(exc)) from None

    def job_types(self) -> list[str]:
        return sorted({job_type for job_type, _ in self.rates})

    def generations(self) -> list[str]:
        return sorted({g for by_generation in self.rates.values() for g in by_generation})

    def steps_per_s(self, job_type: str, generation: str, gpus: int = 1) -> float:
        """Steps/s of `job_type` alone on `gpus` GPUs of `generation` (0.0: it does not fit)."""
        if job_type not in self.job_types():
            close = difflib.get_close_matches(job_type, self.job_types(), n=3)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ThroughputLookupError(f"unknown job type {job_type!r}{hint}")
        by_generation = self.rates.get((job_type, gpus))
        if by_generation is None:
            sizes = sorted(g for t, g in self.rates if t == job_type)
            raise ThroughputLookupError(
                f"{job_type!r} was not measured on {gpus} GPUs (measured: {sizes})"
            )
        if generation in by_generation:
            return by_generation[generation]
        factor = ASSUMED_SPEEDUP_OVER_V100.get(generation)
        if factor is None or "v100" not in by_generation:
            known = sorted({*self.generations(), *ASSUMED_SPEEDUP_OVER_V100})
            raise ThroughputLookupError(
                f"no throughput for generation {generation!r} (known: {', '.join(known)})"
            )
        return factor * by_generation["v100"]


__all__ = ["ENV_THROUGHPUTS", "ThroughputLookupError", "ThroughputTable"]
