"""Load balancing of ticket load across the servers of one generation (docs/design.md §2.3).

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

Given the GPUs the jobs on each server ask (`asked_on`), *relief* moves come first: a job on a
server asking more GPUs than it has (its jobs time-slice) moves to a server where its GPUs are
free, whatever the tickets say, since a job that need not wait should not. Relief moves go from
the most crowded servers, biggest job that fits somewhere first, to the least-loaded server
with room.

No thrash: every move strictly lowers the potential ``(sum of excess, sum(T_s**2 / G_s))``,
compared lexicographically, where a server's excess is the GPUs its jobs ask beyond its own
and T, G its tickets and GPUs. A relief move lowers the excess; a ticket move may not raise it
and must lower the second part, which for equal servers means moving t tickets from a to b only
if ``t < T_a - T_b``. The potential cannot go down forever, so with tickets unchanged no layout
comes back.
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
    servers: Sequence[Server],
    tickets_on: Mapping[str, float],
    gpus: int,
    tickets: float,
    asked_on: Mapping[str, int] | None = None,
) -> Server | None:
    """The feasible server (>= `gpus` GPUs) with the least load once the job joins it.

    With `asked_on` (GPUs the jobs already placed on each server ask), servers where the job
    still finds its GPUs free come first: ticket load decides fair shares among jobs that
    time-slice, but a job that need not time-slice at all should not. Ties go to the earlier
    server in `servers`.
    """
    best: Server | None = None
    best_key = (True, 0.0)
    for server in servers:
        if server.gpus < gpus:
            continue
        crowded = asked_on is not None and asked_on.get(server.id, 0) + gpus > server.gpus
        key = (crowded, (tickets_on.get(server.id, 0.0) + tickets) / server.gpus)
        if (
            best is None
            or key[0] < best_key[0]
            or (key[0] == best_key[0] and key[1] < best_key[1] - _EPS)
        ):
            best, best_key = server, key
    return best


def least_loaded_group(
    servers: Sequence[Server],
    tickets_on: Mapping[str, float],
    gpus: int,
    asked_on: Mapping[str, int] | None = None,
) -> tuple[Server, ...]:
    """Whole servers for a multi-server gang: the least-loaded ones until `gpus` are covered.

    Idle servers (nothing placed, per `asked_on`) come first; among equal loads bigger servers
    come first (fewer servers per gang). Empty when the servers together have fewer than `gpus`
    GPUs.
    """
    asked = asked_on or {}

    def key(i: int) -> tuple[bool, float, int, int]:
        server = servers[i]
        busy = asked.get(server.id, 0) > 0
        return (busy, tickets_on.get(server.id, 0.0) / server.gpus, -server.gpus, i)

    order = sorted(range(len(servers)), key=key)
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
    asked_on: Mapping[str, int] | None = None,
) -> list[Move]:
    """Moves that relieve crowded servers and even out ticket load among `servers` (one
    generation); see module doc.

    `tickets_on` gives each server's ticket load, `asked_on` (optional) the GPUs its jobs ask,
    and `residents_of` its jobs; the latter is only asked about the servers jobs might leave,
    so a call costs O(servers) plus their jobs.
    """
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    load = {s.id: tickets_on.get(s.id, 0.0) for s in servers}
    asked = None if asked_on is None else {s.id: asked_on.get(s.id, 0) for s in servers}
    jobs: dict[str, list[Resident]] = {}

    def residents(server_id: str) -> list[Resident]:
        if server_id not in jobs:
            jobs[server_id] = list(residents_of(server_id))
        return jobs[server_id]

    moves: list[Move] = []
    while len(moves) < budget:
        move = None if asked is None else _relief_move(servers, load, asked, residents)
        if move is None and spread(servers, load) > threshold:
            move = _best_move(servers, load, residents, asked)
        if move is None:
            break
        source, target, resident = move
        residents(source.id).remove(resident)
        residents(target.id).append(resident)
        load[source.id] -= resident.tickets
        load[target.id] += resident.tickets
        if asked is not None:
            asked[source.id] -= resident.gpus
            asked[target.id] += resident.gpus
        moves.append(Move(resident.job_id, source.id, target.id))
    return moves


def _relief_move(
    servers: Sequence[Server],
    load: Mapping[str, float],
    asked: Mapping[str, int],
    residents: Callable[[str], list[Resident]],
) -> tuple[Server, Server, Resident] | None:
    """A job of a crowded server moved to the least-loaded server where it finds free GPUs."""
    room = max((s.gpus - asked[s.id] for s in servers), default=0)
    if room <= 0:
        return None
    crowded = sorted(
        (s for s in servers if asked[s.id] > s.gpus), key=lambda s: s.gpus - asked[s.id]
    )
    for source in crowded[:SCAN]:
        candidates = [r for r in residents(source.id) if r.movable and r.gpus <= room]
        for resident in sorted(candidates, key=lambda r: -r.gpus):
            targets = [
                s for s in servers if s is not source and s.gpus - asked[s.id] >= resident.gpus
            ]
            if targets:
                target = min(targets, key=lambda s: (load[s.id] + resident.tickets) / s.gpus)
                return source, target, resident
    return None


def _excess(asked: int, gpus: int) -> int:
    return max(0, asked - gpus)


def _best_move(
    servers: Sequence[Server],
    load: Mapping[str, float],
    residents: Callable[[str], list[Resident]],
    asked: Mapping[str, int] | None = None,
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
            if asked is not None:
                g, a_a, a_b = resident.gpus, asked[source.id], asked[target.id]
                if _excess(a_a - g, source.gpus) + _excess(a_b + g, target.gpus) > _excess(
                    a_a, source.gpus
                ) + _excess(a_b, target.gpus):
                    continue  # would make jobs wait that do not wait now
            t = resident.tickets
            delta = ((t_a - t) ** 2 - t_a**2) / source.gpus + (
                (t_b + t) ** 2 - t_b**2
            ) / target.gpus
            if delta < best_delta:
                best, best_delta = resident, delta
        if best is not None:
            return source, target, best
    return None
