"""Classic stride scheduling on one GPU (docs/design.md §2.1).

Every job holds tickets and a *pass*. Each quantum the job with the smallest pass runs and its
pass grows by ``1 / tickets``, so over time each job runs in proportion to its tickets.

A job joins at the queue's current minimum pass (or, on an empty queue, at the pass the queue
had reached), so it neither starves the others by joining low nor is starved by joining high.
A job may carry a *lag* (how far its pass was ahead of the minimum of the queue it left) so that
moving between queues does not wipe out what it already consumed.

Tie-break: among equal passes the job that joined the queue earlier runs first (a stable,
first-come order; the join order is kept in snapshots). The slides' table (A 4 tickets, B 1:
B A A A A B A A A) is what this gives when B joined before A.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class StrideEntry:
    """One job in a stride queue. `seq` is its join order, the stable tie-break."""

    id: str
    tickets: float
    pass_: float
    seq: int
    gpus: int = 1

    def key(self) -> tuple[float, int]:
        return (self.pass_, self.seq)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tickets": self.tickets,
            "pass": self.pass_,
            "seq": self.seq,
            "gpus": self.gpus,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StrideEntry:
        return cls(
            id=str(data["id"]),
            tickets=float(data["tickets"]),
            pass_=float(data["pass"]),
            seq=int(data["seq"]),
            gpus=int(data.get("gpus", 1)),
        )


def retick(entry: StrideEntry, tickets: float, floor: float) -> None:
    """Give `entry` new tickets, rescaling how far its pass is above `floor` (its queue's
    minimum pass).

    That distance is service already received, per ticket; measured in the new tickets it is the
    same service. Without rescaling, a job whose tickets rise (say from a sliver of share to a
    full one) would wait until the others caught up with a pass earned at the old rate.
    """
    entry.pass_ = floor + (entry.pass_ - floor) * entry.tickets / tickets
    entry.tickets = tickets


def check_tickets(job_id: str, tickets: float) -> float:
    if not tickets > 0:
        raise ValueError(f"job {job_id}: tickets must be > 0, got {tickets}")
    return float(tickets)


class StrideQueue:
    """Stride scheduling of whole jobs on a single GPU: one job runs per quantum."""

    def __init__(self) -> None:
        self._entries: dict[str, StrideEntry] = {}
        self._floor = 0.0  # pass reached by the queue; where jobs join when it is empty
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._entries

    def min_pass(self) -> float:
        if not self._entries:
            return self._floor
        return min(e.pass_ for e in self._entries.values())

    def join(self, job_id: str, tickets: float, lag: float = 0.0) -> None:
        if job_id in self._entries:
            raise ValueError(f"job {job_id} is already in the queue")
        tickets = check_tickets(job_id, tickets)
        self._entries[job_id] = StrideEntry(
            job_id, tickets, self.min_pass() + max(0.0, lag), self._seq
        )
        self._seq += 1

    def leave(self, job_id: str) -> float:
        """Remove `job_id`; return its lag (pass above the queue's minimum) for a rejoin."""
        floor = self.min_pass()
        lag = self._entries.pop(job_id).pass_ - floor
        self._floor = max(self._floor, floor)
        return lag

    def set_tickets(self, job_id: str, tickets: float) -> None:
        retick(self._entries[job_id], check_tickets(job_id, tickets), self.min_pass())

    def passes(self) -> dict[str, float]:
        return {job_id: e.pass_ for job_id, e in self._entries.items()}

    def next(self) -> str | None:
        """Run one quantum: the minimum-pass job runs and pays ``1 / tickets``."""
        if not self._entries:
            return None
        entry = min(self._entries.values(), key=StrideEntry.key)
        self._floor = max(self._floor, entry.pass_)
        entry.pass_ += 1.0 / entry.tickets
        return entry.id

    def snapshot(self) -> dict[str, Any]:
        return {
            "floor": self._floor,
            "seq": self._seq,
            "jobs": [e.to_dict() for e in self._entries.values()],
        }

    def restore(self, data: dict[str, Any]) -> None:
        """Replace this queue's state with a `snapshot`."""
        entries = [StrideEntry.from_dict(raw) for raw in data["jobs"]]
        self._floor = float(data["floor"])
        self._seq = int(data["seq"])
        self._entries = {e.id: e for e in entries}
