"""Small synthetic traces for the simulator tests, built as gfair CSV text."""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gfair.sim.trace import Trace, parse_trace

HEADER = "submit_time_s,user,gpus,duration_s,job_type,tickets"


@dataclass(frozen=True)
class Row:
    submit_s: float
    user: str
    gpus: int
    duration_s: float
    job_type: str = ""
    tickets: str = ""

    def csv(self) -> str:
        job_type = f'"{self.job_type}"' if self.job_type else ""
        return (
            f"{self.submit_s},{self.user},{self.gpus},{self.duration_s},{job_type},{self.tickets}"
        )


def trace_of(rows: Iterable[Row], source: str = "test.csv") -> Trace:
    text = "\n".join([HEADER, *(row.csv() for row in rows)]) + "\n"
    return parse_trace(io.StringIO(text), source=source)


def backlog(
    users: Iterable[str],
    jobs_per_user: int,
    sizes: tuple[int, ...] = (1,),
    duration_s: float = 1e7,
    job_types: Mapping[str, str] | None = None,
    tickets: Mapping[str, float] | None = None,
) -> Trace:
    """Every user submits all its jobs at t=0; jobs last far longer than the experiment."""
    rows = []
    for user in users:
        for index in range(jobs_per_user):
            rows.append(
                Row(
                    0.0,
                    user,
                    sizes[index % len(sizes)],
                    duration_s,
                    (job_types or {}).get(user, ""),
                    f"{tickets[user]:g}" if tickets and user in tickets else "",
                )
            )
    return trace_of(rows)
