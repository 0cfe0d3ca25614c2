"""`gfair jobs` lists jobs; `gfair job JOB` shows one job's record and its events.

`gfair job JOB --follow` then prints the job's events as they come, until it ends; with `--json`
it prints NDJSON: the job as below on one line, then one line per new event (`{"sequence", ...}`).
`gfair jobs --json` prints a list of job records;
`gfair job --json` prints
``{"user", "job_id", "state", "record", "events": [{"sequence", "id", "type", "time",
"source", "subject", "data"}], "profile", "failures"}``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.table import Table

from gfair.bus.history import HistoricalEvent
from gfair.cli import output, session
from gfair.client import GfairClient, JobDetails
from gfair.client.switching import SwitchStats, describe_charges, describe_estimate
from gfair.events.states import JobState


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    listing = subparsers.add_parser("jobs", help="list jobs", description="List job records.")
    listing.add_argument("--user", help="only this user's jobs")
    listing.add_argument(
        "--state", choices=[s.value for s in JobState], help="only jobs in this state"
    )
    listing.add_argument("--array", metavar="ID", help="only the jobs of this job array")
    session.add_connection_flags(listing)
    listing.set_defaults(func=lambda args: session.run(args, _jobs))

    one = subparsers.add_parser(
        "job", help="show one job", description="Show a job's record and its events."
    )
    one.add_argument("job", metavar="JOB", help="USER/JOB, or JOB with --user")
    one.add_argument(
        "--follow", action="store_true", help="then print its events as they come, until it ends"
    )
    session.add_user_flag(one)
    session.add_connection_flags(one)
    one.set_defaults(func=lambda args: session.run(args, _job))


async def _jobs(client: GfairClient, args: argparse.Namespace) -> int:
    state = JobState(args.state) if args.state else None
    records = await client.jobs(user=args.user, state=state)
    if args.array is not None:
        records = [r for r in records if r.submission.array and r.submission.array.id == args.array]
    if args.json:
        output.print_json([output.record_json(r) for r in records])
    else:
        console = output.console()
        console.print(output.jobs_table(records, console.width))
    return session.EXIT_OK


async def _job(client: GfairClient, args: argparse.Namespace) -> int:
    user, job_id = args.ref
    details = await client.job(user, job_id)
    if args.json and args.follow:
        output.print_json_line(output.details_json(details))
    elif args.json:
        output.print_json(output.details_json(details))
    else:
        console = output.console()
        console.print(_summary(details))
        console.print(events_table(details.events))
    if args.follow and not details.state.terminal:
        after = details.events[-1].sequence if details.events else 0
        async for event in client.watch(user, job_id):
            if event.sequence <= after:
                continue
            if args.json:
                output.print_json_line(output.event_json(event))
            else:
                output.console().print("  ".join(_event_cells(event)))
    return session.EXIT_OK


def events_table(events: Sequence[HistoricalEvent]) -> Table:
    """One row per event; its details whole, folded onto more lines rather than cut (a path
    cut mid-name cannot be opened)."""
    table = Table(title="events", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    rows = [_event_cells(event) for event in events]
    for index, header in enumerate(("seq", "time", "event", "from")):
        widest = max([len(header)] + [len(row[index]) for row in rows])
        table.add_column(header, no_wrap=True, min_width=widest)
    table.add_column("details", overflow="fold", ratio=1)
    for row in rows:
        table.add_row(*row)
    return table


def _event_cells(event: HistoricalEvent) -> tuple[str, ...]:
    data = dict(event.envelope.data)
    for key in ("user", "job_id"):
        data.pop(key, None)
    return (
        str(event.sequence),
        f"{event.envelope.time:%H:%M:%S.%f}"[:-3],
        event.envelope.type.split(".")[2],
        event.envelope.source,
        ", ".join(f"{k}={_value(v)}" for k, v in data.items() if v not in (None, "", [], {})),
    )


def _value(value: object) -> str:
    """A detail as a person reads it: measurements rounded (``runtime_s=0.102``), not
    ``0.10230384300029982``; lists without brackets."""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    if isinstance(value, list | tuple):
        return ",".join(_value(v) for v in value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _summary(details: JobDetails) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("job", str(details.ref))
    table.add_row("state", output.styled_state(details.state))
    record = details.record
    if record is not None:
        sub = record.submission
        table.add_row("command", " ".join(sub.command))
        table.add_row("gpus", str(sub.gpus))
        table.add_row("type", sub.job_type or "-")
        table.add_row("pool", record.generation or "-")
        table.add_row("servers", ", ".join(record.servers) or "-")
        table.add_row("running on", ", ".join(record.nodes) or "-")
        table.add_row("attempt", str(record.attempt))
        table.add_row("checkpoint", str(record.last_checkpoint_step or "-"))
        if sub.array is not None:
            limit = f", at most {sub.array.limit} running" if sub.array.limit else ""
            table.add_row("array", f"{sub.array.id} index {sub.array.index}{limit}")
        if sub.after_ok:
            held = " (held until they complete)" if record.state is JobState.HELD else ""
            table.add_row("after ok", ", ".join(sub.after_ok) + held)
        if record.reason:
            table.add_row("reason", record.reason)
        table.add_row("submitted", f"{sub.submitted_at:%Y-%m-%d %H:%M:%S %Z}")
    costs = SwitchStats.of(details.events)
    if costs.suspends or costs.cold_start_p50_s is not None:
        table.add_row("switches", costs.describe())
    estimate = details.profile.switches.published if details.profile is not None else None
    if estimate is not None:
        # What the profiler published and split-stride charges: next to the medians above,
        # which cover the job's whole history, these cover its last few switches.
        table.add_row("estimated", describe_estimate(estimate))
        table.add_row("charged", describe_charges(estimate))
    if details.profile is not None and details.profile.measured:
        table.add_row(
            "measured",
            ", ".join(
                f"{g} {m.rate:.2f}/s/GPU ({m.samples})" for g, m in details.profile.measured.items()
            ),
        )
    return table
