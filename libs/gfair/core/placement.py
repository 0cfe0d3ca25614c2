"""Placement: which pool, then which servers, a job goes to, with typed reasons.

See docs/design.md §2.4.

Modelled on the Kubernetes scheduler framework: *filters* drop pools the job cannot use, each
saying why (`Rejection`); a *choice rule* then picks among what is left and the decision says
which rule chose. Filters:

- ``job-type-fits``: the measured throughput of the job's type on that generation is zero;
- ``gang-fits``: the gang fits neither one server of the pool nor the pool's servers together
  (a job larger than one server takes whole servers of one generation).

Choice rules; "fastest" means the fastest pool for this job (relative speed, then generation
rank):

1. the fastest pool that is either
   - ``unused-entitlement``: the user's placed jobs ask fewer GPUs there than it is entitled
     to, or
   - ``surplus``: a pool where the user holds share and the job fits in GPUs nobody's placed
     jobs ask for;
   the decision names the first of the two that holds for the chosen pool. Idle fast GPUs are
   thus taken before a slower pool's entitlement: entitlement is held as the same fraction of
   every pool, so a user with a few jobs has "unused entitlement" mostly in the largest (often
   slowest) pool, and preferring it would leave faster pools idle on an uncontended cluster.
   When the pool's other users come back, the scheduler's pool migrations move such a job out
   (its user is then over its entitlement in an oversubscribed pool);
2. ``surplus``: the fastest pool with GPUs nobody's placed jobs ask for, share or not. A user
   holding no share of a pool sold it in trading, as the one gaining least there, so surplus
   goes to it only when it has no unused entitlement anywhere (docs/design.md §2.4: surplus goes
   to the users who gain most from it);
3. ``least-oversubscribed``: the pool where the user's demand, this job included, exceeds its
   entitlement by the smallest factor (its jobs time-slice there in proportion to tickets).

"Idle" takes the job's shape into account where the caller says so (`PoolView.free_fit`).
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
    # Whether the job finds its GPUs free as server choice takes them (one server with that
    # many free GPUs, or enough wholly idle servers for a multi-server gang); None: judge by
    # the pool's demand alone. Idle GPUs scattered over servers do not make a pool idle for a
    # gang: placed there it would time-slice.
    free_fit: bool | None = None


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

    def unused(v: PoolView) -> bool:
        return v.used < v.entitled - _EPS

    def idle(v: PoolView) -> bool:
        return v.demand + gpus <= v.pool.gpus + _EPS and v.free_fit is not False

    def surplus(view: PoolView) -> PoolChoice:
        reason = (
            f"{view.pool.generation}: fastest pool with idle GPUs "
            f"({view.demand:g} of {view.pool.gpus} asked)"
        )
        return PoolChoice(view.pool.generation, "surplus", reason, tuple(rejections))

    open_pools = [v for v in feasible if unused(v) or (idle(v) and v.entitled > _EPS)]
    if open_pools:
        view = fastest(open_pools)
        if not unused(view):
            return surplus(view)
        reason = (
            f"{view.pool.generation}: fastest pool with unused entitlement "
            f"({view.used:g} of {view.entitled:.3g} GPUs used)"
        )
        return PoolChoice(view.pool.generation, "unused-entitlement", reason, tuple(rejections))
    idle_pools = [v for v in feasible if idle(v)]
    if idle_pools:
        return surplus(fastest(idle_pools))

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
