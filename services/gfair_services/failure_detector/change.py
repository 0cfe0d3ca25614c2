"""What one input to the failure detector changed: events to publish, records to write.

The books compute a `Change` without applying it; the service publishes its events, writes its
records, and only then applies it to the books. A crash or a failed write in between leaves the
books as they were, so the redelivered input decides the same again and its events, with the
same derived ids, are dropped as duplicates by JetStream.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from gfair.events.envelope import EventData
from gfair.state.job_failures import JobFailureRecord
from gfair.state.node_record import NodeRecord


@dataclass(frozen=True, slots=True)
class Change:
    events: tuple[EventData, ...] = ()
    nodes: tuple[NodeRecord, ...] = ()
    jobs: tuple[JobFailureRecord, ...] = ()

    def __add__(self, other: Change) -> Change:
        return Change(
            events=self.events + other.events,
            nodes=_latest(self.nodes + other.nodes, lambda r: r.node_id),
            jobs=_latest(self.jobs + other.jobs, lambda r: r.key),
        )

    @property
    def empty(self) -> bool:
        return not (self.events or self.nodes or self.jobs)


NO_CHANGE = Change()


R = TypeVar("R")


def _latest(records: tuple[R, ...], key: Callable[[R], str]) -> tuple[R, ...]:
    # A later change of the same record supersedes an earlier one in the same commit.
    by_key: dict[str, R] = {}
    for record in records:
        by_key[key(record)] = record
    return tuple(by_key.values())
