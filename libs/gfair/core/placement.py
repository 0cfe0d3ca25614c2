"""Placement: which pool, then which servers, a job goes to (DESIGN 2.4), with typed reasons.

Modelled on the Kubernetes scheduler framework: *filters* drop pools the job cannot use, each
saying why (`Rejection`); a *choice rule* then picks among what is left and the decision says
which rule chose. Filters:

- ``job-type-fits``: the measured throughput of the job's type on that generation is zero;
- ``gang-fits``: the gang fits neither one server of the pool nor the pool's servers together
  (a job larger than one server takes whole servers of one generation).

Choice rules, tried in order, each preferring the fastest pool for this job (relative speed,
then generation rank):

1. ``unused-entitlement``: a pool where the user's placed jobs ask fewer GPUs than it is entitled
   to;
2. ``surplus``: a pool with GPUs nobody's placed jobs ask for (capacity the entitled users leave
   idle goes to whoever gains most from it, and a job placed there gains its speed on it);
3. ``least-oversubscribed``: the pool where the user's demand, this job included, exceeds its
   entitlement by the smallest factor (its jobs time-slice there in proportion to tickets).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gfair.core.balance import least_loaded, least_loaded_group
from gfair.core.cluster import generation_rank
from gfair.core.pools import Pool

_EPS = 1e-9


@dataclass(frozen=True)
class Rejection:
    pool: str
    rule: str
    reason: str


@dataclass(frozen=True)
class PoolView:
    """What placement needs to know about one pool for one job of one user."""

    pool: Pool
    speed: float  # the job's relative speed there; 0 means its type does not fit
    entitled: float  # GPUs of share the user holds there
    used: float  # GPUs the user's placed jobs ask there
    demand: float  # GPUs all placed jobs ask there


@dataclass(frozen=True)
class PoolChoice:
    pool: str | None
    rule: str  # the choice rule that picked it, or "rejected"
    reason: str
    rejections: tuple[Rejection, ...] = ()

    @property
    def accepted(self) -> bool:
        return self.pool is not None


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


def choose_pool(gpus: int, job_type: str | None, views: Sequence[PoolView]) -> PoolChoice:
    rejections: list[Rejection] = []
    feasible: list[PoolView] = []
    for view in views:
        rejection = filter_pool(gpus, view, job_type)
        if rejection is None:
            feasible.append(view)
        else:
            rejections.append(rejection)
    if not feasible:
        return PoolChoice(
            None, "rejected", _rejection_reason(gpus, views, rejections), tuple(rejections)
        )

    def fastest(candidates: list[PoolView]) -> PoolView:
        return max(candidates, key=lambda v: (v.speed, generation_rank(v.pool.generation)))

    unused = [v for v in feasible if v.used < v.entitled - _EPS]
    if unused:
        view = fastest(unused)
        reason = (
            f"{view.pool.generation}: fastest pool with unused entitlement "
            f"({view.used:g} of {view.entitled:.3g} GPUs used)"
        )
        return PoolChoice(view.pool.generation, "unused-entitlement", reason, tuple(rejections))
    idle = [v for v in feasible if v.demand + gpus <= v.pool.gpus + _EPS]
    if idle:
        view = fastest(idle)
        reason = (
            f"{view.pool.generation}: fastest pool with idle GPUs "
            f"({view.demand:g} of {view.pool.gpus} asked)"
        )
        return PoolChoice(view.pool.generation, "surplus", reason, tuple(rejections))

    def oversubscription(v: PoolView) -> tuple[float, float, tuple[int, str]]:
        ratio = (v.used + gpus) / v.entitled if v.entitled > _EPS else float("inf")
        return (ratio, -v.speed, (-generation_rank(v.pool.generation)[0], v.pool.generation))

    view = min(feasible, key=oversubscription)
    reason = (
        f"{view.pool.generation}: least oversubscribed for the user "
        f"({view.used + gpus:g} GPUs asked for {view.entitled:.3g} entitled)"
    )
    return PoolChoice(view.pool.generation, "least-oversubscribed", reason, tuple(rejections))


def _rejection_reason(gpus: int, views: Sequence[PoolView], rejections: Sequence[Rejection]) -> str:
    if not views:
        return "the cluster has no GPUs"
    if all(r.rule == "gang-fits" for r in rejections):
        largest = max(views, key=lambda v: v.pool.gpus)
        return (
            f"needs {gpus} GPUs; largest generation ({largest.pool.generation}) "
            f"has {largest.pool.gpus}"
        )
    return "; ".join(r.reason for r in rejections)


def choose_servers(
    pool: Pool,
    gpus: int,
    tickets: float,
    tickets_on: Mapping[str, float],
    asked_on: Mapping[str, int] | None = None,
) -> tuple[str, ...]:
    """Servers for a job in `pool`: the least-loaded fitting server, or whole servers.

    Servers where the job's GPUs are still free (per `asked_on`) are preferred; see
    `balance.least_loaded`.
    """
    if gpus <= pool.largest_server:
        server = least_loaded(pool.servers, tickets_on, gpus, tickets, asked_on)
        return (server.id,) if server is not None else ()
    return tuple(s.id for s in least_loaded_group(pool.servers, tickets_on, gpus, asked_on))
