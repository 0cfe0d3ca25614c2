"""`gfair users`: each user's tickets, fair share, entitlement and received GPU time per pool.

Entitlements come from the trading auction (`gfair_shares`), received GPU time from
split-stride's usage (`gfair_stride`). With a shares file, each user's account (its path; a
user the file does not name is at the root, "-"); `gfair shares show` sums them per account.
`--json` prints ``{"revision", "computed_at", "usage_since", "as_of", "capacity", "users":
[{"user", "account", "tickets", "jobs", "demand", "entitled", "received", "throughput_fair",
"throughput_entitled", "gain", "pools": {POOL: {"fair", "entitled", "gpu_seconds",
"received"}}}], "trades": [...]}`` (``account``: ``""`` at the root).
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from gfair.cli import output, session
from gfair.cli.arguments import add_command
from gfair.client import GfairClient


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "users", __doc__)
    session.add_connection_flags(parser)
    parser.set_defaults(func=lambda args: session.run(args, _users))


async def _users(client: GfairClient, args: argparse.Namespace) -> int:
    view = await client.users()
    if args.json:
        output.print_json(output.users_json(view))
        return session.EXIT_OK
    console = output.console()
    console.print(output.users_table(view, console.width))
    if view.trades:
        trades = Table(title="trades in force")
        for column in ("buyer", "seller", "fast", "slow", "GPUs", "price", "bids"):
            trades.add_column(column)
        for t in view.trades:
            trades.add_row(
                t.buyer,
                t.seller,
                t.fast_pool,
                t.slow_pool,
                output.gpus(t.quantity),
                f"{t.price:.2f}",
                f"{t.buyer_bid:.2f} / {t.seller_bid:.2f}",
            )
        console.print(trades)
    return session.EXIT_OK
