"""`gfair history`: finished and running jobs with their times and GPU-hours (like `sacct`).

    gfair history --user alice --since 7d --state completed --state failed

One line per job: submitted, waited (submission to first start), ran (first start to end,
suspended time included), GPU-hours per GPU generation, outcome and reason. `--since` and
`--until` take a time (ISO 8601, e.g. 2026-11-23T09:00, local time unless it says otherwise) or
a duration back from now (``2h``, ``7d``); a job is listed when it lived at some time between
them. `--json` prints a list of ``{"user", "job_id", "state", "gpus", "generation",
"submitted_at", "started_at", "ended_at", "wait_s", "runtime_s", "gpu_hours": {GEN: H},
"reason"}``.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.table import Table

from gfair.cli import output, session
from gfair.client import GfairClient
from gfair.events.states import JobState
from gfair.state.usage import JobAccount, account, parse_duration, selected


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "history",
        help="jobs with their wait, run time and GPU-hours (sacct)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
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
    parser.set_defaults(func=lambda args: session.run(args, _history))


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


async def _history(client: GfairClient, args: argparse.Namespace) -> int:
    now = datetime.now(UTC)
    since = point_in_time(args.since, now) if args.since else None
    until = point_in_time(args.until, now) if args.until else None
    if since is not None and until is not None and until < since:
        raise ValueError(f"--until {args.until} is before --since {args.since}")
    records = selected(
        await client.jobs(),
        users=args.user,
        states=[JobState(s) for s in args.state],
        since=since,
        until=until,
    )
    lines = [account(r, now) for r in records]
    if args.json:
        output.print_json([account_json(line, now) for line in lines])
    else:
        output.console().print(history_table(lines, now))
    return session.EXIT_OK


def account_json(line: JobAccount, now: datetime) -> dict[str, Any]:
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
        "gpu_hours": line.gpu_hours,
        "reason": line.reason,
    }


def span(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def history_table(lines: list[JobAccount], now: datetime) -> Table:
    table = Table(title=f"{len(lines)} job(s)")
    table.add_column("job", no_wrap=True)
    table.add_column("state")
    table.add_column("gpus", justify="right")
    table.add_column("submitted")
    table.add_column("waited", justify="right")
    table.add_column("ran", justify="right")
    table.add_column("GPU-hours", justify="right")
    table.add_column("reason")
    for line in lines:
        table.add_row(
            f"{line.user}/{line.job_id}",
            output.styled_state(line.state),
            str(line.gpus),
            f"{line.submitted_at.astimezone():%Y-%m-%d %H:%M:%S}",
            span(line.wait_s),
            span(line.runtime_s(now)),
            ", ".join(f"{g} {h:.2f}" for g, h in line.gpu_hours.items()) or "-",
            (line.reason or "")[:60],
        )
    return table
