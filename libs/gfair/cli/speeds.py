"""Warnings for speeds gfair has to assume: a job type or a GPU generation its throughput table
did not measure. Both are accepted (a new model or a new GPU must be schedulable), but shares
across generations and trades rest on the assumed speeds until the profiler has measured the
jobs, and the user should hear which ones."""

from __future__ import annotations

from collections.abc import Iterable

from gfair.core.throughput import DEFAULT_SPEEDS
from gfair.sdk.throughput_table import ThroughputLookupError, ThroughputTable


def _table() -> ThroughputTable | None:
    try:
        return ThroughputTable.load()
    except ThroughputLookupError:
        return None  # the services will say so; nothing to compare against here


def job_type_warning(job_type: str | None) -> str | None:
    """What `submit --job-type` should warn of, or None for a measured (or no) job type."""
    if job_type is None:
        return None  # most submissions: no table to read
    table = _table()
    if table is None:
        return None
    known = table.job_types()
    if job_type in known:
        return None
    close = [k for k in known if k.lower() == job_type.lower()]
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    speeds = ", ".join(f"{g} {DEFAULT_SPEEDS[g]:g}" for g in ("k80", "p100", "v100"))
    return (
        f"no measured speeds for job type {job_type!r}{hint}: gfair assumes its default "
        f"speeds per generation ({speeds}, relative to a K80) until the job is profiled"
    )


def generation_warnings(generations: Iterable[str]) -> list[str]:
    """What `up --cluster` should warn of: one line per generation the table did not measure."""
    table = _table()
    measured = set(table.generations()) if table is not None else set()
    lines = []
    for generation in sorted(set(generations) - measured):
        # What the scheduler's estimator assumes (`gfair.core.throughput`): its default
        # speed for the generation, 1.0 (a K80's) for one it does not know.
        speed = DEFAULT_SPEEDS.get(generation, 1.0)
        assumed = f"{speed / DEFAULT_SPEEDS['v100']:.2g}x a V100"
        lines.append(
            f"no measured speeds for {generation} GPUs: gfair assumes {assumed} for every job "
            "type until its jobs there are profiled"
        )
    return lines
