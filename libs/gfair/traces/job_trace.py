"""The trace of one job's life: found by the job's id among all spans, put in causal order.

Every span about a job carries ``gfair.job.id`` and ``gfair.user`` (the bus tags publish and
process spans from the event payload). The job's trace is the one its submission started:
the trace of the earliest span naming the job. Other traces may mention the job too (a
quantum tick's per-server decision, or events published before a service joined them to the
job's trace); they are reported by id, not merged, since a trace is one causal tree.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gfair.traces.span_record import SpanRecord


class TraceNotFound(LookupError):
    """No span names the job."""


class AmbiguousJob(LookupError):
    """Several users have a job with this id: say which one."""

    def __init__(self, job_id: str, users: Sequence[str]) -> None:
        super().__init__(
            f"job id {job_id!r} belongs to several users ({', '.join(users)}); pass --user"
        )
        self.users = tuple(users)


def _start_key(span: SpanRecord) -> tuple[int, int, str]:
    return (span.start_ns, span.end_ns, span.span_id)


def causal_order(spans: Iterable[SpanRecord]) -> list[SpanRecord]:
    """Parents before their children; otherwise by start time.

    A span whose parent is not among `spans` (a remote parent that was never exported, say a
    tool's publish) counts as a root. Clocks of different hosts may disagree, so a child can
    seem to start before its parent: causality wins over the clock.
    """
    spans = list(spans)
    ids = {span.span_id for span in spans}
    children: dict[str | None, list[SpanRecord]] = defaultdict(list)
    for span in spans:
        parent = span.parent_span_id if span.parent_span_id in ids else None
        children[parent].append(span)
    ready = [(_start_key(span), span) for span in children.get(None, [])]
    heapq.heapify(ready)
    ordered: list[SpanRecord] = []
    seen: set[str] = set()
    while ready:
        _, span = heapq.heappop(ready)
        if span.span_id in seen:  # a duplicated span id (a span exported twice)
            continue
        seen.add(span.span_id)
        ordered.append(span)
        for child in children.get(span.span_id, []):
            heapq.heappush(ready, (_start_key(child), child))
    return ordered


@dataclass(frozen=True, slots=True)
class JobTrace:
    user: str
    job_id: str
    trace_id: str
    spans: tuple[SpanRecord, ...]  # causal order
    # Other traces with spans naming this job, oldest first.
    other_trace_ids: tuple[str, ...] = ()

    @property
    def start_ns(self) -> int:
        return min(span.start_ns for span in self.spans)

    @property
    def end_ns(self) -> int:
        return max(span.end_ns for span in self.spans)

    @property
    def services(self) -> frozenset[str]:
        return frozenset(span.service for span in self.spans)

    def roots(self) -> list[SpanRecord]:
        ids = {span.span_id for span in self.spans}
        return [span for span in self.spans if span.parent_span_id not in ids]

    def to_json(self) -> dict[str, Any]:
        return {
            "trace_id": self.trace_id,
            "user": self.user,
            "job_id": self.job_id,
            "spans": [span.to_json() for span in self.spans],
            "other_trace_ids": list(self.other_trace_ids),
        }


def find_job_trace(spans: Iterable[SpanRecord], job_id: str, user: str | None = None) -> JobTrace:
    """The trace of `job_id`'s life (of `user`'s job when given).

    `TraceNotFound` when no span names the job, `AmbiguousJob` when several users have a job
    with that id and `user` is None.
    """
    by_trace: dict[str, list[SpanRecord]] = defaultdict(list)
    mentions: list[SpanRecord] = []
    for span in spans:
        by_trace[span.trace_id].append(span)
        if span.job_id == job_id and (user is None or span.user == user):
            mentions.append(span)
    if not mentions:
        whose = f"{user}'s job" if user else "job"
        raise TraceNotFound(f"no span mentions {whose} {job_id!r}")
    users = sorted({span.user for span in mentions if span.user is not None})
    if user is None and len(users) > 1:
        raise AmbiguousJob(job_id, users)
    owner = user or (users[0] if users else "")
    first_seen: dict[str, int] = {}
    for span in mentions:
        first_seen[span.trace_id] = min(first_seen.get(span.trace_id, span.start_ns), span.start_ns)
    traces = sorted(first_seen, key=lambda trace_id: (first_seen[trace_id], trace_id))
    return JobTrace(
        user=owner,
        job_id=job_id,
        trace_id=traces[0],
        spans=tuple(causal_order(by_trace[traces[0]])),
        other_trace_ids=tuple(traces[1:]),
    )
