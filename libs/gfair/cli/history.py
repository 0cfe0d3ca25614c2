"""`gfair history`: finished and running jobs with their times and GPU-hours (like `sacct`).

    gfair history --user alice --since 7d --state completed --state failed

One line per job: submitted, waited (submission to first start), held (the time its processes
held its GPUs), wall (first start to end: with the time it spent suspended or in a retry's
back-off), GPU-hours per GPU generation, outcome and reason. `--since` and
`--until` take a time (ISO 8601, e.g. 2026-11-23T09:00, local time unless it says otherwise) or
a duration back from now (``2h``, ``7d``); a job is listed when it lived at some time between
them. `--json` prints a list of ``{"user", "job_id", "state", "gpus", "generation",
"submitted_at", "started_at", "ended_at", "wait_s", "runtime_s" (wall), "held_s",
"gpu_hours": {GEN: H}, "reason"}``.
"""

from __future__ import annotations

import argparse
from datetime import UTC, date, datetime, timedelta
from typing import Any

from rich.console import Group
from rich.text import Text

from gfair.cli import output, session
from gfair.cli.arguments import add_command
from gfair.cli.output import Column
from gfair.client import GfairClient
from gfair.events.states import JobState
from gfair.state.usage import HistoryLine, account, parse_duration, selected


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "history", __doc__)
    parser.add_argument(
        "--user", action="append", default=[], help="only this user's jobs (repeatable)"
    )
    parser.add_argument(
        "--state",
        action="append",
        default=[],
        choices=[s.value for s in JobState],
        help="only jobs in this state (repeatable)",
    )
    parser.add_argument("--since", metavar="TIME", help="jobs that lived after TIME (or 7d ago)")
    parser.add_argument("--until", metavar="TIME", help="jobs that lived before TIME")
    session.add_connection_flags(parser)
    parser.set_defaults(func=lambda args: session.run(args, _history, check=_period))


def point_in_time(text: str, now: datetime) -> datetime:
    """An ISO 8601 time (naive: local), or a duration back from `now`; `ValueError` else."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        try:
            return now - timedelta(seconds=parse_duration(text))
        except ValueError:
            raise ValueError(
                f"{text!r}: expected a time (2026-11-23T09:00) or a duration ago (2h, 7d)"
            ) from None
    return moment if moment.tzinfo is not None else moment.astimezone()


def _period(args: argparse.Namespace) -> None:
    """`--since` and `--until` as times, in `args.since_at` and `args.until_at`."""
    now = datetime.now(UTC)
    args.since_at = args.until_at = None
    for flag in ("since", "until"):
        text = getattr(args, flag)
        if text:
            try:
                setattr(args, f"{flag}_at", point_in_time(text, now))
            except ValueError as exc:
                raise ValueError(f"--{flag} {exc}") from None
    if args.since_at is not None and args.until_at is not None and args.until_at < args.since_at:
        raise ValueError(f"--until {args.until} is before --since {args.since}")


async def _history(client: GfairClient, args: argparse.Namespace) -> int:
    now = datetime.now(UTC)
    records = selected(
        await client.jobs(),
        users=args.user,
        states=[JobState(s) for s in args.state],
        since=args.since_at,
        until=args.until_at,
    )
    lines = [account(r, now) for r in records]
    if args.json:
        output.print_json([account_json(line, now) for line in lines])
    else:
        console = output.console()
        console.print(history_table(lines, now, console.width))
    return session.EXIT_OK


def account_json(line: HistoryLine, now: datetime) -> dict[str, Any]:
    return {
        "user": line.user,
        "job_id": line.job_id,
        "state": str(line.state),
        "gpus": line.gpus,
        "generation": line.generation,
        "submitted_at": line.submitted_at.isoformat(),
        "started_at": line.started_at.isoformat() if line.started_at else None,
        "ended_at": line.ended_at.isoformat() if line.ended_at else None,
        "wait_s": line.wait_s,
        "runtime_s": line.runtime_s(now),
        "held_s": line.held_s,
        "gpu_hours": line.gpu_hours,
        "reason": line.reason,
    }


def history_table(lines: list[HistoryLine], now: datetime, width: int = 80) -> Group:
    """The table, then each job's reason on a line of its own (whole, however long)."""
    today = now.astimezone().date()
    rows = [
        (
            f"{line.user}/{line.job_id}",
            output.styled_state(line.state),
            str(line.gpus),
            _moment(line.submitted_at, today),
            output.seconds(line.wait_s),
            output.seconds(line.held_s) if line.started_at is not None else "-",
            output.seconds(line.runtime_s(now)),
            f"{sum(line.gpu_hours.values()):.2f}" if line.gpu_hours else "-",
        )
        for line in lines
    ]
    table = output.fitted_table(
        f"{len(lines)} job(s)",
        [
            Column("job"),
            Column("state"),
            Column("gpus", "right"),
            Column("submitted", optional=True),
            Column("waited", "right", optional=True),
            Column("held", "right"),
            Column("wall", "right"),
            Column("GPU-h", "right"),
        ],
        rows,
        width=width,
        caption="held: time its processes held GPUs; wall: first start to end, with time "
        "suspended or backing off between retries",
    )
    reasons = [
        Text.assemble((f"{line.user}/{line.job_id}", "bold"), f": {line.reason}")
        for line in lines
        if line.reason
    ]
    return Group(table, *reasons)


def _moment(at: datetime, today: date) -> str:
    local = at.astimezone()
    return f"{local:%H:%M}" if local.date() == today else f"{local:%Y-%m-%d %H:%M}"
