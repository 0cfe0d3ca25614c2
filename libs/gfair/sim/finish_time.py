"""Finish-time fairness: each job's rho, under two definitions of its fair share, and their summary.

rho = JCT / the JCT the job would have had alone on its fair share of the cluster. A job is
*present* from its submission to its completion (to the end of the run if unfinished; rejected
jobs never are), queued or running; ``N_j``, the *jobs present over its life*, is the number
of jobs present averaged over [submit, end] of job j (itself included, so N_j >= 1). ``T_j``
is its run time alone (``ideal_s``: its gang on the cluster's fastest generation for it), ``g``
its GPU count, ``C`` the cluster's GPUs.

- ``themis`` (Mahajan et al., "Themis: Fair and Efficient GPU Cluster Scheduling", NSDI 2020):
  rho = JCT / (T_j * N_j). The share is a 1/N_j share of *time* on the job's own GPUs, whatever
  their number: a 1/N share of the cluster that ignores the GPU count.
- ``gang_aware`` (the isolated share of Gavel's finish-time fairness, Narayanan et al., OSDI
  2020): the job's fair share is 1/N_j of the cluster's GPUs, C/N_j; a g-GPU gang on C/N_j
  GPUs runs a fraction min(1, C / (N_j g)) of the time, so
  rho = JCT / (T_j * max(1, N_j g / C)). A gang larger than its share is expected to wait
  in proportion; a small job in a big cluster is expected to run at once.

A summary gives, over the completed jobs, the worst (largest) rho, the mean, the fractions of
jobs with rho > 1 and rho > 1.05, and Jain's index over the rhos (1: all equal).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

THEMIS: Final = "themis"
GANG_AWARE: Final = "gang_aware"
DEFINITIONS: Final = (THEMIS, GANG_AWARE)


@dataclass(frozen=True)
class RhoSummary:
    """Over the completed jobs; None (every field) when none completed."""

    worst: float | None
    mean: float | None
    over_1: float | None  # fraction of the jobs with rho > 1
    over_1_05: float | None
    jain: float | None


def jobs_present(spans: Sequence[tuple[float, float]]) -> list[float | None]:
    """For each [begin, end) span, the number of spans covering it, averaged over it (None
    for an empty span). Exact: the count is integrated between consecutive span ends."""
    changes: dict[float, int] = {}
    for begin, end in spans:
        changes[begin] = changes.get(begin, 0) + 1
        changes[end] = changes.get(end, 0) - 1
    integral: dict[float, float] = {}
    total, count, previous = 0.0, 0, 0.0
    for time in sorted(changes):
        total += count * (time - previous)
        integral[time] = total
        count += changes[time]
        previous = time
    return [
        (integral[end] - integral[begin]) / (end - begin) if end > begin else None
        for begin, end in spans
    ]


def rho_themis(jct_s: float, ideal_s: float, present: float) -> float:
    return jct_s / (ideal_s * present)


def rho_gang_aware(jct_s: float, ideal_s: float, present: float, gpus: int, capacity: int) -> float:
    return jct_s / (ideal_s * max(1.0, present * gpus / capacity))
