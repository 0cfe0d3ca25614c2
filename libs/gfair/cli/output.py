"""How tool commands print: JSON for programs, rich tables for people."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

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


@dataclass(frozen=True)
class Column:
    header: str
    justify: str = "left"
    # Left out, rightmost first, when the table would not fit the terminal otherwise.
    optional: bool = False


def fitted_table(
    title: str,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    width: int,
    caption: str | None = None,
) -> Table:
    """A table whose cells are never cut: each column as wide as its widest cell or header, no
    vertical rules, and optional columns left out (the caption says which) until it fits
    `width`. Free text (reasons, details) belongs under it, as lines of its own, where the
    terminal wraps it between words.
    """
    widths = [
        max([len(c.header)] + [Text.from_markup(row[i]).cell_len for row in rows])
        for i, c in enumerate(columns)
    ]
    shown = list(range(len(columns)))
    left_out: list[str] = []
    # Between two columns: a space of padding each side and the box's blank rule.
    while sum(widths[i] + 3 for i in shown) - 3 > width:
        optional = [i for i in shown if columns[i].optional]
        if not optional:
            break
        shown.remove(optional[-1])
        left_out.insert(0, columns[optional[-1]].header)
    notes = [caption] if caption else []
    if left_out:
        notes.append(f"left out to fit: {', '.join(left_out)} (a wider terminal, or --json)")
    table = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        caption="\n".join(notes) or None,
        caption_justify="left",
    )
    for i in shown:
        table.add_column(
            columns[i].header,
            justify=columns[i].justify,  # type: ignore[arg-type]
            min_width=widths[i],
            no_wrap=True,
        )
    for row in rows:
        table.add_row(*(row[i] for i in shown))
    return table


def seconds(value: float | None) -> str:
    """A duration in at most two units, short enough for a narrow column: ``0.2s``, ``11.0s``,
    ``4m05s``, ``1h45m``, ``2d03h`` (a 0.2 s run is not ``0:00:00``)."""
    if value is None:
        return "-"
    if value < 60:
        return f"{value:.1f}s"
    whole = round(value)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"


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
                "account": u.account,
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


def jobs_table(records: list[JobRecord], width: int = 80) -> Table:
    rows = [
        (
            f"{r.user}/{r.job_id}",  # whole: an id cut in two cannot be pasted back
            styled_state(r.state) + _held_for(r),
            str(r.gpus),
            r.generation or "-",
            ",".join(r.nodes or r.servers) or "-",
            str(r.attempt),
            str(r.last_checkpoint_step) if r.last_checkpoint_step is not None else "-",
            r.submission.job_type or r.submission.name or "-",
        )
        for r in records
    ]
    return fitted_table(
        f"{len(records)} job(s)",
        [
            Column("job"),
            Column("state"),
            Column("gpus", "right"),
            Column("pool"),
            Column("servers", optional=True),
            Column("attempt", "right", optional=True),
            Column("ckpt", "right", optional=True),
            Column("type", optional=True),
        ],
        rows,
        width=width,
    )


def _held_for(record: JobRecord) -> str:
    if record.state is not JobState.HELD:
        return ""
    return f" (after {','.join(record.submission.after_ok)})"


def users_table(view: UsersView, width: int = 80) -> Table:
    pools = list(view.capacity) or sorted({p for u in view.users for p in u.pools})
    capacity = ", ".join(f"{p} {view.capacity.get(p, 0)}" for p in pools)
    # Accounts show only with a shares file that places someone: a flat cluster's table is as
    # it always was.
    accounts = any(u.account for u in view.users)
    rows = []
    for u in view.users:
        cells = [
            u.user,
            *([u.account or "-"] if accounts else []),
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
        rows.append(cells)
    # Per-pool columns are the detail: at 80 columns the totals stay, and the caption says
    # what was left out.
    return fitted_table(
        f"users (revision {view.revision if view.revision is not None else '-'}; "
        f"GPUs: {capacity or 'none'})",
        [
            Column("user"),
            *([Column("account")] if accounts else []),
            Column("tickets", "right"),
            Column("jobs", "right"),
            Column("demand", "right", optional=True),
            *(Column(pool, "right", optional=True) for pool in pools),
            Column("entitled", "right"),
            Column("received", "right"),
            Column("gain", "right"),
        ],
        rows,
        width=width,
        caption="per pool: fair/entitled/received GPUs; entitled = share after trading (fair = "
        "before); received = average GPUs held since split-stride started counting; gain = "
        "from trading",
    )
