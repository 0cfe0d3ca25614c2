"""Admission filters: the pools a job could ever run in, with typed reasons for the others.

See docs/design.md §2.4. Where and when an admitted job runs is the decision kernel's, each
quantum (`kernel.decide`); this only keeps out the jobs no quantum could ever run, and says why.

Modelled on the Kubernetes scheduler framework's filters: each drops a pool the job cannot use
and says why (`Rejection`):

- ``job-type-fits``: the measured throughput of the job's type on that generation is zero;
- ``gang-fits``: the gang is larger than the pool (a job larger than one server takes whole
  servers of one generation, so the pool's GPUs together are what bounds it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gfair.core.pools import Pool


@dataclass(frozen=True)
class Rejection:
    pool: str
    rule: str
    reason: str


@dataclass(frozen=True)
class PoolView:
    """What admission needs to know about one pool for one job."""

    pool: Pool
    speed: float  # the job's relative speed there; 0 means its type does not fit


@dataclass(frozen=True)
class PoolFilter:
    usable: tuple[str, ...]  # pools the job could run in
    rejections: tuple[Rejection, ...]  # why each other pool cannot take it

    @property
    def accepted(self) -> bool:
        return bool(self.usable)

    @property
    def rule(self) -> str:
        """The filter that refused, for a job no pool takes."""
        return self.rejections[0].rule if self.rejections else "rejected"


def filter_pool(gpus: int, view: PoolView, job_type: str | None) -> Rejection | None:
    pool = view.pool
    if view.speed <= 0:
        return Rejection(
            pool.generation,
            "job-type-fits",
            f"job type {job_type!r} does not fit on {pool.generation} (zero measured throughput)",
        )
    if gpus > pool.gpus:
        return Rejection(
            pool.generation,
            "gang-fits",
            f"needs {gpus} GPUs; {pool.generation} has {pool.gpus} in all",
        )
    return None


def filter_pools(gpus: int, job_type: str | None, views: Sequence[PoolView]) -> PoolFilter:
    usable: list[str] = []
    rejections: list[Rejection] = []
    for view in views:
        rejection = filter_pool(gpus, view, job_type)
        if rejection is None:
            usable.append(view.pool.generation)
        else:
            rejections.append(rejection)
    return PoolFilter(tuple(usable), tuple(rejections))


def rejection_reason(gpus: int, views: Sequence[PoolView], rejections: Sequence[Rejection]) -> str:
    """Why no pool takes the job, in one line."""
    if not views:
        return "the cluster has no GPUs"
    if all(r.rule == "gang-fits" for r in rejections):
        largest = max(views, key=lambda v: v.pool.gpus)
        return (
            f"needs {gpus} GPUs; largest generation ({largest.pool.generation}) "
            f"has {largest.pool.gpus}"
        )
    return "; ".join(r.reason for r in rejections)
