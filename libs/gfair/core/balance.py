"""Load balancing of ticket load across the servers of one generation (DESIGN 2.3).

Per-server stride is only fair cluster-wide when every server carries the same *ticket load*
(tickets of the jobs queued on it per GPU). New jobs go to the least-loaded feasible server;
when loads drift, `propose_migrations` moves single-server jobs from the most- to the least-
loaded servers, under two brakes:

- *threshold*: nothing moves while the spread of loads, ``(max - min) / mean``, is at most the
  threshold (a relative number: 0.25 means the busiest server may carry 25% of the mean more than
  the idlest before anything moves);
- *budget*: at most that many moves per call.

Each move goes to the least-loaded server, from the most-loaded of the `SCAN` busiest servers
that has a job whose move lowers the potential below.

No thrash: a move must strictly lower the potential ``sum(T_s**2 / G_s)`` (T tickets, G GPUs),
which for equal servers means moving t tickets from a to b only if ``t < T_a - T_b``. The
potential cannot go down forever, so with tickets unchanged a job never moves back and forth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gfair.core.cluster import Server

_EPS = 1e-12
# Sources tried per move, most loaded first: when none of them can shed a job to the least
# loaded server, the search stops, so one call costs O(servers) plus the jobs of a few servers
# even when the spread cannot be reduced (e.g. servers with one job each beside empty ones).
SCAN = 8


@dataclass(frozen=True)
class Move:
    job_id: str
    from_server: str
    to_server: str


@dataclass(frozen=True, slots=True)
class Resident:
    """A job as the balancer sees it: its tickets on a server, and whether it may move."""

    job_id: str
    gpus: int
    tickets: float
    movable: bool = True


def load(tickets: float, gpus: int) -> float:
    return tickets / gpus


def least_loaded(
    servers: Sequence[Server], tickets_on: Mapping[str, float], gpus: int, tickets: float
) -> Server | None:
    """The feasible server (>= `gpus` GPUs) with the least load once the job joins it.

    Ties go to the earlier server in `servers`.
    """
    best: Server | None = None
    best_load = 0.0
    for server in servers:
        if server.gpus < gpus:
            continue
        after = (tickets_on.get(server.id, 0.0) + tickets) / server.gpus
        if best is None or after < best_load - _EPS:
            best, best_load = server, after
    return best


def least_loaded_group(
    servers: Sequence[Server], tickets_on: Mapping[str, float], gpus: int
) -> tuple[Server, ...]:
    """Whole servers for a multi-server gang: the least-loaded ones until `gpus` are covered.

    Among equal loads bigger servers come first (fewer servers per gang). Empty when the
    servers together have fewer than `gpus` GPUs.
    """
    order = sorted(
        range(len(servers)),
        key=lambda i: (tickets_on.get(servers[i].id, 0.0) / servers[i].gpus, -servers[i].gpus, i),
    )
    chosen: list[Server] = []
    covered = 0
    for index in order:
        if covered >= gpus:
            break
        chosen.append(servers[index])
        covered += servers[index].gpus
    return tuple(chosen) if covered >= gpus else ()


def spread(servers: Sequence[Server], tickets_on: Mapping[str, float]) -> float:
    """``(max load - min load) / mean load`` over `servers` (0 when idle)."""
    if not servers:
        return 0.0
    loads = [load(tickets_on.get(s.id, 0.0), s.gpus) for s in servers]
    total_gpus = sum(s.gpus for s in servers)
    mean = sum(tickets_on.get(s.id, 0.0) for s in servers) / total_gpus
    if mean <= 0:
        return 0.0
    return (max(loads) - min(loads)) / mean


def propose_migrations(
    servers: Sequence[Server],
    tickets_on: Mapping[str, float],
    residents_of: Callable[[str], Iterable[Resident]],
    threshold: float,
    budget: int,
) -> list[Move]:
    """Moves that even out ticket load among `servers` (one generation); see module doc.

    `tickets_on` gives each server's ticket load and `residents_of` its jobs; the latter is
    only asked about the servers jobs might leave, so a call costs O(servers) plus their jobs.
    """
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    load = {s.id: tickets_on.get(s.id, 0.0) for s in servers}
    jobs: dict[str, list[Resident]] = {}

    def residents(server_id: str) -> list[Resident]:
        if server_id not in jobs:
            jobs[server_id] = list(residents_of(server_id))
        return jobs[server_id]

    moves: list[Move] = []
    while len(moves) < budget and spread(servers, load) > threshold:
        move = _best_move(servers, load, residents)
        if move is None:
            break
        source, target, resident = move
        residents(source.id).remove(resident)
        residents(target.id).append(resident)
        load[source.id] -= resident.tickets
        load[target.id] += resident.tickets
        moves.append(Move(resident.job_id, source.id, target.id))
    return moves


def _best_move(
    servers: Sequence[Server],
    load: Mapping[str, float],
    residents: Callable[[str], list[Resident]],
) -> tuple[Server, Server, Resident] | None:
    """The move lowering the potential most, tried from the most-loaded server down."""
    by_load = sorted(servers, key=lambda s: load[s.id] / s.gpus)
    target = by_load[0]
    for source in reversed(by_load[-SCAN:] if len(by_load) > SCAN else by_load[1:]):
        t_a, t_b = load[source.id], load[target.id]
        if t_a / source.gpus <= t_b / target.gpus + _EPS:
            return None
        best: Resident | None = None
        best_delta = -_EPS * max(1.0, t_a * t_a / source.gpus)
        for resident in residents(source.id):
            if not resident.movable or resident.gpus > target.gpus:
                continue
            t = resident.tickets
            delta = ((t_a - t) ** 2 - t_a**2) / source.gpus + (
                (t_b + t) ** 2 - t_b**2
            ) / target.gpus
            if delta < best_delta:
                best, best_delta = resident, delta
        if best is not None:
            return source, target, best
    return None
