"""How tool commands print: JSON for programs, rich tables for people."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from gfair.bus.history import HistoricalEvent
from gfair.client import JobDetails, Submitted, UsersView
from gfair.events.states import JobState
from gfair.state.job_record import JobRecord

STATE_STYLES: dict[JobState, str] = {
    JobState.RUNNING: "green",
    JobState.COMPLETED: "bold green",
    JobState.FAILED: "bold red",
    JobState.REJECTED: "red",
    JobState.CANCELLED: "yellow",
    JobState.SUSPENDED: "cyan",
}


def console() -> Console:
    return Console(highlight=False)


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, default=_jsonable)
    sys.stdout.write("\n")


def print_json_line(value: Any) -> None:
    """One compact JSON object on one line (NDJSON), flushed: a stream a program reads as it
    comes (``gfair job --follow --json | jq -c``)."""
    sys.stdout.write(json.dumps(value, default=_jsonable, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def styled_state(state: JobState) -> str:
    style = STATE_STYLES.get(state)
    return f"[{style}]{state}[/]" if style else str(state)


def gpus(value: float) -> str:
    return f"{value:.2f}"


# -- JSON shapes (documented in docs of each command) -------------------------------------


def submitted_json(submitted: Submitted) -> dict[str, Any]:
    return {
        "user": submitted.user,
        "job_id": submitted.job_id,
        "event_id": submitted.event_id,
        "state": str(submitted.state),
        "reason": submitted.reason,
        "code": str(submitted.code) if submitted.code else None,
        "servers": list(submitted.servers),
    }


def record_json(record: JobRecord) -> dict[str, Any]:
    # The ids of folded events are the record's bookkeeping, not the job's.
    return record.model_dump(mode="json", exclude={"applied_event_ids"})


def event_json(event: HistoricalEvent) -> dict[str, Any]:
    envelope = event.envelope
    return {
        "sequence": event.sequence,
        "id": envelope.id,
        "type": envelope.type,
        "time": envelope.time.isoformat(),
        "source": envelope.source,
        "subject": envelope.subject,
        "data": envelope.data,
    }


def details_json(details: JobDetails) -> dict[str, Any]:
    return {
        "user": details.user,
        "job_id": details.job_id,
        "state": str(details.state),
        "record": record_json(details.record) if details.record is not None else None,
        "events": [event_json(e) for e in details.events],
        "profile": details.profile.model_dump(mode="json") if details.profile else None,
        "failures": details.failures.model_dump(mode="json") if details.failures else None,
    }


def users_json(view: UsersView) -> dict[str, Any]:
    return {
        "revision": view.revision,
        "computed_at": view.computed_at.isoformat() if view.computed_at else None,
        "usage_since": view.usage_since.isoformat() if view.usage_since else None,
        "as_of": view.as_of.isoformat() if view.as_of else None,
        "capacity": view.capacity,
        "users": [
            {
                "user": u.user,
                "tickets": u.tickets,
                "jobs": u.jobs,
                "demand": u.demand,
                "entitled": u.entitled,
                "received": u.received,
                "throughput_fair": u.throughput_fair,
                "throughput_entitled": u.throughput_entitled,
                "gain": u.gain,
                "pools": {
                    p.pool: {
                        "fair": p.fair,
                        "entitled": p.entitled,
                        "gpu_seconds": p.gpu_seconds,
                        "received": p.received,
                    }
                    for p in u.pools.values()
                },
            }
            for u in view.users
        ],
        "trades": [t.model_dump(mode="json") for t in view.trades],
    }


# -- tables -------------------------------------------------------------------------------


def jobs_table(records: list[JobRecord]) -> Table:
    table = Table(title=f"{len(records)} job(s)")
    table.add_column("job", no_wrap=True)  # an id cut in two cannot be pasted back
    for column in ("state", "gpus", "pool", "servers", "attempt", "ckpt", "type"):
        table.add_column(column, justify="right" if column in ("gpus", "attempt") else "left")
    for r in records:
        table.add_row(
            f"{r.user}/{r.job_id}",
            styled_state(r.state) + _held_for(r),
            str(r.gpus),
            r.generation or "-",
            ",".join(r.nodes or r.servers) or "-",
            str(r.attempt),
            str(r.last_checkpoint_step) if r.last_checkpoint_step is not None else "-",
            r.submission.job_type or r.submission.name or "-",
        )
    return table


def _held_for(record: JobRecord) -> str:
    if record.state is not JobState.HELD:
        return ""
    return f" (after {','.join(record.submission.after_ok)})"


def users_table(view: UsersView) -> Table:
    pools = list(view.capacity) or sorted({p for u in view.users for p in u.pools})
    capacity = ", ".join(f"{p} {view.capacity.get(p, 0)}" for p in pools)
    table = Table(
        title=f"users (revision {view.revision if view.revision is not None else '-'}; "
        f"GPUs: {capacity or 'none'})",
        caption="entitled = share after trading (fair = before); received = average GPUs held "
        "since split-stride started counting",
    )
    table.add_column("user")
    table.add_column("tickets", justify="right")
    table.add_column("jobs", justify="right")
    table.add_column("demand", justify="right")
    for pool in pools:
        table.add_column(f"{pool} fair/entitled/received", justify="right")
    table.add_column("entitled", justify="right")
    table.add_column("received", justify="right")
    table.add_column("trade gain", justify="right")
    for u in view.users:
        cells = [
            u.user,
            f"{u.tickets:g}" if u.tickets is not None else "-",
            str(u.jobs),
            str(u.demand),
        ]
        for pool in pools:
            p = u.pools.get(pool)
            cells.append(
                f"{gpus(p.fair)}/{gpus(p.entitled)}/{gpus(p.received)}" if p is not None else "-"
            )
        cells += [gpus(u.entitled), gpus(u.received), f"{u.gain:+.0%}"]
        table.add_row(*cells)
    return table
