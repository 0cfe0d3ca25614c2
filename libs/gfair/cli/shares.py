"""`gfair shares show|apply|set`: the accounts tree as the cluster runs it, with every account's
and user's tickets, fair share, entitlement and received GPUs; and the operator's changes to it,
in force from the trading auction's next allocation without a restart (docs/design.md §1.1).

`apply FILE` puts a whole shares file in force (checked here first: a bad file is refused
naming the line and field, and nothing is sent); `set NAME=TICKETS ...` changes the tickets of
accounts (by path) or users in the tree in force (a user it does not name yet joins the root).
Both publish `SharesChanged` with the operator, the reason and every line that changed: the
audit trail, in GFAIR_SCHED. A tenant's login is refused.

The tree and the entitlements come from the trading auction (`gfair_shares`: the accounts of
the shares file in force and the account of each user it names), received GPU time from
split-stride's usage, as for `gfair users`. An account's numbers are the sums of its users'
(fair: its ticket share without trading; entitled: after trading; received: the GPUs its jobs
held on average since split-stride started counting); the percentages are of the cluster's
GPUs; the caption says where the tree comes from (the services' file, or who changed it when).
Without a shares file every user sits at the root. A tenant sees itself and the accounts above
it. `--json` prints ``{"capacity", "revision", "changed_by", "changed_at", "usage_since",
"as_of", "rows": [{"kind", "name", "account", "level", "tickets", "fair", "entitled",
"received"}]}``, the rows in the table's order (``kind``: ``root``, ``account`` or ``user``;
``account``: the path of an account, or the account a user is in).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from gfair.cli import output, session
from gfair.cli.arguments import add_command
from gfair.client import GfairClient
from gfair.client.views import UsersView
from gfair.core.shares_file import SharesFileError, describe_mode, parse_shares, with_tickets
from gfair.core.tickets import check_tickets
from gfair.events.scheduling import SharesChanged
from gfair.shares import read_shares
from gfair.state.share_record import SharesRecord

ROOT = ""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "shares", __doc__)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="the accounts tree with every level's shares")
    session.add_connection_flags(show)
    show.set_defaults(func=lambda args: session.run(args, _show))
    apply = actions.add_parser("apply", help="put a shares file in force (operator)")
    apply.add_argument("file", type=Path, metavar="FILE")
    apply.add_argument("--reason", help="why (kept with the change)")
    session.add_connection_flags(apply)
    apply.set_defaults(func=lambda args: session.run(args, _apply, _read_file))
    set_ = actions.add_parser("set", help="change accounts' or users' tickets (operator)")
    set_.add_argument("assignments", nargs="+", metavar="NAME=TICKETS")
    set_.add_argument("--reason", help="why (kept with the change)")
    session.add_connection_flags(set_)
    set_.set_defaults(func=lambda args: session.run(args, _set, _read_assignments))


@dataclass(frozen=True)
class TreeRow:
    kind: str  # "root", "account" or "user"
    name: str  # the account's last path part, or the user
    account: str  # the account's path, or the user's account
    level: int  # 0 the root, 1 its children, ...
    tickets: float | None
    fair: float
    entitled: float
    received: float


def tree_rows(view: UsersView, record: SharesRecord | None) -> list[TreeRow]:
    """The root, then depth first every account (its sub-accounts, then its users)."""
    accounts = dict(record.accounts) if record is not None else {}
    members = dict(record.members) if record is not None else {}
    sums: dict[str, list[float]] = {path: [0.0, 0.0, 0.0] for path in [ROOT, *accounts]}
    placed: dict[str, list[TreeRow]] = {}
    for user in view.users:
        account = members.get(user.user, ROOT)
        if account not in accounts:  # a tenant's view leaves out what it may not see
            account = ROOT
        fair = sum(p.fair for p in user.pools.values())
        numbers = (fair, user.entitled, user.received)
        level = _level(account) + 1
        row = TreeRow("user", user.user, account, level, user.tickets, *numbers)
        placed.setdefault(account, []).append(row)
        path: str | None = account
        while path is not None:
            sums[path] = [a + b for a, b in zip(sums[path], numbers, strict=True)]
            path = None if path == ROOT else path.rpartition("/")[0]
    children: dict[str, list[str]] = {}
    for path in sorted(accounts):
        children.setdefault(path.rpartition("/")[0], []).append(path)
    rows = [TreeRow("root", "(cluster)", ROOT, 0, None, *sums[ROOT])]

    def visit(account: str) -> None:
        for path in children.get(account, []):
            name = path.rpartition("/")[2]
            tickets = accounts[path].tickets
            rows.append(TreeRow("account", name, path, _level(path), tickets, *sums[path]))
            visit(path)
        rows.extend(sorted(placed.get(account, []), key=lambda row: row.name))

    visit(ROOT)
    return rows


def _read_file(args: argparse.Namespace) -> None:
    args.tree = read_shares(args.file)  # SharesFileError (a ValueError): a usage error


def _read_assignments(args: argparse.Namespace) -> None:
    parsed: list[tuple[str, float]] = []
    for item in args.assignments:
        name, sep, value = item.partition("=")
        try:
            tickets = float(value)
        except ValueError:
            tickets = float("nan")
        if not sep or not name:
            raise ValueError(f"{item!r}: expected NAME=TICKETS (an account's path or a user)")
        check_tickets(f"{item!r}", tickets)
        parsed.append((name, tickets))
    args.parsed = parsed


async def _apply(client: GfairClient, args: argparse.Namespace) -> int:
    return _changed(await client.change_shares(args.tree, reason=args.reason), args)


async def _set(client: GfairClient, args: argparse.Namespace) -> int:
    tree = await client.shares_in_force()
    for name, tickets in args.parsed:
        try:
            tree = with_tickets(tree, name, tickets)
        except SharesFileError as error:
            return session.fail(str(error), session.EXIT_USAGE)
    return _changed(await client.change_shares(tree, reason=args.reason), args)


def _changed(data: SharesChanged, args: argparse.Namespace) -> int:
    if args.json:
        output.print_json(data.model_dump(mode="json"))
        return session.EXIT_OK
    said = "; ".join(data.changes) or "nothing changed"
    output.console().print(f"shares changed by {data.operator}: {said}")
    return session.EXIT_OK


def _level(path: str) -> int:
    return 0 if path == ROOT else path.count("/") + 1


async def _show(client: GfairClient, args: argparse.Namespace) -> int:
    view = await client.users()
    record = await client.shares()
    rows = tree_rows(view, record)
    if args.json:
        output.print_json(
            {
                "capacity": view.capacity,
                "revision": view.revision,
                "changed_by": record.shares_changed_by if record is not None else None,
                "changed_at": record.shares_changed_at if record is not None else None,
                "fairness": _mode(record),
                "usage_since": view.usage_since,
                "as_of": view.as_of,
                "rows": [asdict(row) for row in rows],
            }
        )
        return session.EXIT_OK
    output.console().print(tree_table(rows, sum(view.capacity.values()), _source(record)))
    return session.EXIT_OK


def _source(record: SharesRecord | None) -> str:
    """Where the tree in force comes from, and its fairness mode."""
    if record is None or not record.shares:
        return "no shares file: every user at the root"
    mode = f"fairness {_mode(record)}"
    if record.shares_changed_by is None or record.shares_changed_at is None:
        return f"the services' shares file; {mode}"
    at = record.shares_changed_at.isoformat(timespec="seconds")
    return f"changed by {record.shares_changed_by} at {at}; {mode}"


def _mode(record: SharesRecord | None) -> str:
    """The fairness mode of the tree in force (instantaneous without a shares file)."""
    if record is None or not record.shares:
        return "instantaneous"
    return describe_mode(parse_shares(record.shares, "the shares in force"))


def tree_table(rows: list[TreeRow], capacity: int, caption: str | None = None) -> Table:
    table = Table(title=f"shares of {capacity} GPUs", caption=caption)
    for column in ("account / user", "tickets", "fair", "entitled", "received", "ent %", "rec %"):
        table.add_column(column, justify="left" if column == "account / user" else "right")
    for row in rows:
        indent = "  " * max(row.level - 1, 0)
        name = f"[bold]{row.name}/[/]" if row.kind == "account" else row.name
        table.add_row(
            indent + name if row.kind != "root" else f"[bold]{row.name}[/]",
            f"{row.tickets:g}" if row.tickets is not None else "-",
            output.gpus(row.fair),
            output.gpus(row.entitled),
            output.gpus(row.received),
            _percent(row.entitled, capacity),
            _percent(row.received, capacity),
        )
    return table


def _percent(gpus: float, capacity: int) -> str:
    return f"{gpus / capacity:.1%}" if capacity > 0 else "-"
