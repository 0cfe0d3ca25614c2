"""Gang-aware stride scheduling on one server (docs/design.md §2.2).

Every quantum all the server's GPUs count as free; jobs are visited by (pass, join order) and
each one that fits runs on all its GPUs at once and pays ``gpus / tickets``. Small jobs fill the
gaps; the lowest-pass job always fits an empty server, so big gangs never starve.

Tie-break: equal passes go to the job that joined earlier (`StrideEntry.seq`). The slides' table
(A..E of 1, 1, 2, 2, 4 GPUs on 4 GPUs: t0 E; t1 A,B,C; t2 A,B,D; ...) is reproduced exactly when
E joined first (e.g. it was already queued when A..D arrived); with A..E joining in alphabetical
order the schedule differs only by that tie at time 0, and the long-run shares are the same.

When the jobs' GPUs add up to no more than the server's, they all run without sorting: most
servers of a lightly loaded cluster cost one pass over their jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import attrgetter
from typing import Any

from gfair.sim.baselines.stride import StrideEntry, check_tickets, retick

ENTRY_ORDER = attrgetter("pass_", "seq")


def gang_pick(entries: Iterable[StrideEntry], free: int) -> list[StrideEntry]:
    """Greedy all-or-nothing fill of `free` GPUs by `entries` taken in the order given."""
    picked: list[StrideEntry] = []
    for entry in entries:
        if free == 0:
            break
        if entry.gpus <= free:
            picked.append(entry)
            free -= entry.gpus
    return picked


class GangStride:
    """The gang-aware stride queue of one server with `gpus` GPUs."""

    def __init__(self, gpus: int) -> None:
        if gpus < 1:
            raise ValueError(f"a server needs >= 1 GPU, got {gpus}")
        self.gpus = gpus
        self._entries: dict[str, StrideEntry] = {}
        self._floor = 0.0
        self._seq = 0
        self._demand = 0  # GPUs asked by all jobs together
        self._tickets = 0.0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._entries

    @property
    def demand(self) -> int:
        return self._demand

    @property
    def tickets(self) -> float:
        """Sum of the tickets of the jobs queued here (the server's ticket load)."""
        return self._tickets

    def job_ids(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def entry(self, job_id: str) -> StrideEntry:
        return self._entries[job_id]

    def min_pass(self) -> float:
        if not self._entries:
            return self._floor
        return min(e.pass_ for e in self._entries.values())

    def join(self, job_id: str, gpus: int, tickets: float, lag: float = 0.0) -> None:
        if job_id in self._entries:
            raise ValueError(f"job {job_id} is already queued on this server")
        if not 1 <= gpus <= self.gpus:
            raise ValueError(f"job {job_id} asks {gpus} GPUs; the server has {self.gpus}")
        tickets = check_tickets(job_id, tickets)
        entry = StrideEntry(job_id, tickets, self.min_pass() + max(0.0, lag), self._seq, gpus)
        self._entries[job_id] = entry
        self._seq += 1
        self._demand += gpus
        self._tickets += tickets

    def leave(self, job_id: str) -> float:
        """Remove `job_id`; return its lag (pass above the queue minimum) for a later rejoin."""
        floor = self.min_pass()
        entry = self._entries.pop(job_id)
        self._floor = max(self._floor, floor)
        self._demand -= entry.gpus
        self._tickets = sum(e.tickets for e in self._entries.values())
        return entry.pass_ - floor

    def set_tickets(self, job_id: str, tickets: float) -> None:
        self.set_many({job_id: tickets})

    def set_many(self, tickets: Mapping[str, float]) -> None:
        """Give several jobs new tickets at once (the same as one `set_tickets` each).

        Reticking keeps every pass at or above the queue's minimum and the minimum job at it,
        so the minimum is found once, not once per job.
        """
        checked = {job_id: check_tickets(job_id, value) for job_id, value in tickets.items()}
        floor = self.min_pass()
        for job_id, value in checked.items():
            entry = self._entries[job_id]
            self._tickets += value - entry.tickets
            retick(entry, value, floor)

    def passes(self) -> dict[str, float]:
        return {job_id: e.pass_ for job_id, e in self._entries.items()}

    def schedule(self) -> tuple[str, ...]:
        """One quantum: the jobs that hold GPUs; each pays ``gpus / tickets``."""
        entries = self._entries.values()
        if self._demand <= self.gpus:
            picked: Iterable[StrideEntry] = entries
        else:
            picked = gang_pick(sorted(entries, key=ENTRY_ORDER), self.gpus)
        run = []
        for entry in picked:
            entry.pass_ += entry.gpus / entry.tickets
            run.append(entry.id)
        return tuple(run)

    def snapshot(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "floor": self._floor,
            "seq": self._seq,
            "jobs": [e.to_dict() for e in self._entries.values()],
        }

    def restore(self, data: dict[str, Any]) -> None:
        """Replace this queue's state with a `snapshot` (the server size must match)."""
        if int(data["gpus"]) != self.gpus:
            raise ValueError(f"snapshot is of a {data['gpus']}-GPU server, not {self.gpus}")
        entries = [StrideEntry.from_dict(raw) for raw in data["jobs"]]
        self._floor = float(data["floor"])
        self._seq = int(data["seq"])
        self._entries = {e.id: e for e in entries}
        self._demand = sum(e.gpus for e in entries)
        self._tickets = sum(e.tickets for e in entries)
