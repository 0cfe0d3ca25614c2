"""`gfair usage`: each user's GPU-hours over recent windows, and decayed (like `sshare`).

    gfair usage --windows 1h,1d,7d --half-life 7d

Per user: jobs (running), GPU-hours since the records began per GPU generation, GPU-hours in
each window ending now, and usage decayed with a half-life (GPU-hours a half-life ago count
half), with its share of every user's decayed usage. Read from the job records, whose GPU time
is kept per job, not per time slice (`gfair.state.usage` says how it is placed in time).
`--half-life` defaults to ``$GFAIR_USAGE_HALF_LIFE``, else 7d. With a shares file in force
that places users in accounts (docs/design.md §1.1), the table is the tree, as `sshare` shows
it: each account's line (its users' sums) above its sub-accounts and users. `--json` prints a
list of ``{"user", "account", "jobs", "running", "gpu_hours": {GEN: H}, "windows": {WINDOW: H},
"decayed_gpu_hours", "decayed_share"}`` (``account``: ``""`` at the root).
"""

from __future__ import annotations

import argparse
import os
from datetime import UTC, datetime
from typing import Any

from rich.table import Table

from gfair.cli import output, session
from gfair.cli.arguments import add_command
from gfair.client import GfairClient
from gfair.state.usage import UserUsage, format_duration, parse_duration, usage

HALF_LIFE_ENV = "GFAIR_USAGE_HALF_LIFE"
DEFAULT_HALF_LIFE = "7d"
DEFAULT_WINDOWS = "1h,1d,7d,30d"


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "usage", __doc__)
    parser.add_argument("--user", action="append", default=[], help="only this user (repeatable)")
    parser.add_argument(
        "--windows",
        default=DEFAULT_WINDOWS,
        metavar="LIST",
        help=f"comma-separated windows back from now (default {DEFAULT_WINDOWS})",
    )
    parser.add_argument(
        "--half-life",
        default=os.environ.get(HALF_LIFE_ENV, DEFAULT_HALF_LIFE),
        metavar="DURATION",
        help=f"of the decayed usage (default ${HALF_LIFE_ENV}, else {DEFAULT_HALF_LIFE})",
    )
    session.add_connection_flags(parser)
    parser.set_defaults(func=lambda args: session.run(args, _usage, check=_spans))


def windows(text: str) -> list[float]:
    try:
        found = [parse_duration(item) for item in text.split(",") if item.strip()]
    except ValueError as exc:
        raise ValueError(f"--windows {exc}") from None
    if not found:
        raise ValueError(f"--windows {text!r}: give at least one, e.g. 1h,1d,7d")
    return found


def _spans(args: argparse.Namespace) -> None:
    """`--windows` and `--half-life` in seconds, in `args.spans` and `args.half_life_s`."""
    args.spans = windows(args.windows)
    try:
        args.half_life_s = parse_duration(args.half_life)
    except ValueError as exc:
        raise ValueError(f"--half-life {exc}") from None


async def _usage(client: GfairClient, args: argparse.Namespace) -> int:
    spans, half_life_s = args.spans, args.half_life_s
    records = [r for r in await client.jobs() if not args.user or r.user in args.user]
    lines = usage(records, datetime.now(UTC), windows_s=spans, half_life_s=half_life_s)
    shares = await client.shares()
    members = dict(shares.members) if shares is not None else {}
    accounts = set(shares.accounts) if shares is not None else set()
    if args.json:
        output.print_json([usage_json(line, members.get(line.user, "")) for line in lines])
    else:
        rows = tree_rows(lines, members, accounts)
        output.console().print(usage_table(rows, spans, half_life_s))
    return session.EXIT_OK


def tree_rows(
    lines: list[UserUsage], members: dict[str, str], accounts: set[str]
) -> list[tuple[str, UserUsage]]:
    """(label, line) per table row: without accounts the users as they are; with them, depth
    first, each account (its users' sums, labelled ``path/``) before its sub-accounts and
    users, users indented by their depth; the root's users last."""
    if not accounts:
        return [(line.user, line) for line in lines]
    placed: dict[str, list[UserUsage]] = {}
    sums: dict[str, UserUsage] = {path: UserUsage(user=f"{path}/") for path in accounts}
    for line in lines:
        account = members.get(line.user, "")
        account = account if account in accounts else ""
        placed.setdefault(account, []).append(line)
        path = account
        while path:
            _add(sums[path], line)
            path = path.rpartition("/")[0]
    children: dict[str, list[str]] = {}
    for path in sorted(accounts):
        children.setdefault(path.rpartition("/")[0], []).append(path)
    rows: list[tuple[str, UserUsage]] = []

    def visit(account: str, depth: int) -> None:
        for path in children.get(account, []):
            rows.append(("  " * depth + path.rpartition("/")[2] + "/", sums[path]))
            visit(path, depth + 1)
        rows.extend(("  " * depth + line.user, line) for line in placed.get(account, []))

    visit("", 0)
    return rows


def _add(total: UserUsage, line: UserUsage) -> None:
    total.jobs += line.jobs
    total.running += line.running
    for generation, hours in line.gpu_hours.items():
        total.gpu_hours[generation] = total.gpu_hours.get(generation, 0.0) + hours
    for window, hours in line.windows.items():
        total.windows[window] = total.windows.get(window, 0.0) + hours
    total.decayed_gpu_hours += line.decayed_gpu_hours
    total.decayed_share += line.decayed_share


def usage_json(line: UserUsage, account: str = "") -> dict[str, Any]:
    return {
        "user": line.user,
        "account": account,
        "jobs": line.jobs,
        "running": line.running,
        "gpu_hours": dict(sorted(line.gpu_hours.items())),
        "windows": {format_duration(w): h for w, h in line.windows.items()},
        "decayed_gpu_hours": line.decayed_gpu_hours,
        "decayed_share": line.decayed_share,
    }


def usage_table(rows: list[tuple[str, UserUsage]], spans: list[float], half_life_s: float) -> Table:
    pools = sorted({g for _, line in rows for g in line.gpu_hours})
    table = Table(
        title="GPU-hours per user",
        caption=f"decayed: half-life {format_duration(half_life_s)}; "
        "share: of all users' decayed usage",
    )
    table.add_column("user")
    table.add_column("jobs (running)", justify="right")
    for pool in pools:
        table.add_column(f"{pool} total", justify="right")
    for span in spans:
        table.add_column(f"last {format_duration(span)}", justify="right")
    table.add_column("decayed", justify="right")
    table.add_column("share", justify="right")
    for label, line in rows:
        table.add_row(
            label,
            f"{line.jobs} ({line.running})",
            *(f"{line.gpu_hours.get(p, 0.0):.2f}" for p in pools),
            *(f"{line.windows[s]:.2f}" for s in spans),
            f"{line.decayed_gpu_hours:.2f}",
            f"{line.decayed_share:.0%}",
        )
    return table
