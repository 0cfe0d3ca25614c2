"""Users' accounts with the decision kernel, kept between quanta (docs/design.md §2.7).

The split-stride state machine (`gfair.core.scheduler`), which the simulator and the split-stride
service both drive, keeps per active user a kernel `UserState` (arrival order, entitlement and
credit per pool) and per job its pass and arrival order. How those change as shares, users and
jobs change is decided here:

- `entitle`: new entitlements; a user new to a pool joins it at the priority of the pool's
  most-owed member (its minimum pass, in stride terms), so it neither jumps ahead of anyone nor
  waits behind everyone;
- `joining_pass`: a new job joins at its user's minimum pass;
- `ceiling`: what a user's credit may save up for (its largest gang, see `kernel.settle`);
- `demand`: what a user asks, the one definition the machine and the auctions (the trading
  auction's, the simulator's) use: the
  GPUs of its admitted, unfinished jobs, whether they run, wait or are being retried, less what
  its job arrays ask beyond their limits (`arrays.excess_demand`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gfair.core.arrays import ArrayMember, excess_demand
from gfair.core.kernel import UserState

_EPS = 1e-9


def entitle(
    users: Sequence[UserState],
    entitled: Mapping[str, Mapping[str, float]],
    generations: Iterable[str],
) -> None:
    """Give each user its entitlement per pool; users new to a pool join it (module doc)."""
    for user in users:
        user.entitled = dict(entitled.get(user.name, {}))
    for generation in generations:
        _join(generation, users)


def _join(generation: str, users: Sequence[UserState]) -> None:
    newcomers = [u for u in users if generation not in u.credit]
    if not newcomers:
        return
    top = max(
        (
            (u.credit[generation] + u.entitled[generation]) / u.entitled[generation]
            for u in users
            if generation in u.credit and u.entitled.get(generation, 0.0) > _EPS
        ),
        default=1.0,
    )
    for user in newcomers:
        user.credit[generation] = (top - 1.0) * user.entitled.get(generation, 0.0)


def joining_pass(passes: Iterable[float]) -> float:
    """The pass a user's new job starts from: the lowest of its other jobs' (0 for a first)."""
    return min(passes, default=0.0)


def ceiling(gang_sizes: Iterable[int]) -> float:
    """What a user's credit may save up for: its largest gang."""
    return float(max(gang_sizes, default=1))


def demand(gangs: Iterable[tuple[str, int, ArrayMember | None]]) -> dict[str, float]:
    """User -> GPUs its admitted, unfinished jobs ask, from (user, GPUs, array membership or
    None) per job, less what its arrays ask beyond their limits."""
    asked: dict[str, float] = {}
    in_arrays: dict[str, list[tuple[int, ArrayMember | None]]] = {}
    for user, gpus, member in gangs:
        asked[user] = asked.get(user, 0.0) + gpus
        if member is not None:
            in_arrays.setdefault(user, []).append((gpus, member))
    for user, members in in_arrays.items():
        asked[user] -= excess_demand(members)
    return asked
