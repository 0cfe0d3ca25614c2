"""`gfair top`: the live view of `gfair demo`, for any cluster.

    gfair top --refresh 2 --window 60

Each user's entitled against received GPUs per pool (received: the average over about the
last `--window` seconds, from split-stride's usage counters read at its ticks; until the view
has watched that long, over the time since split-stride began counting, and the header states
the span measured), what runs on each server this quantum, the
trades in force, and counts of the jobs' lifecycle events and of trades since the streams
began (the first refresh reads the job history once). Redrawn every `--refresh` seconds on a
terminal until Ctrl-C; elsewhere one line per refresh. `--once` draws one view and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.text import Text

from gfair.cli import output, session
from gfair.cli.arguments import add_command, positive
from gfair.cli.demo_dashboard import (
    DashboardFrame,
    ShareWindow,
    Tally,
    panels,
    plain_line,
    received_over,
)
from gfair.client import GfairClient
from gfair.events.jobs import JobEvent


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "top", __doc__)
    parser.add_argument(
        "--refresh", type=positive, default=2.0, metavar="SECONDS", help="default 2"
    )
    parser.add_argument(
        "--window",
        type=positive,
        default=60.0,
        metavar="SECONDS",
        help="received share averaged over this long (default 60)",
    )
    parser.add_argument("--once", action="store_true", help="draw one view and exit")
    parser.add_argument("--nats", metavar="URL", help="NATS server URL(s), comma-separated")
    parser.add_argument("--creds", metavar="FILE", help="NATS credentials file (JWT and NKey)")
    parser.set_defaults(func=lambda args: session.run(args, _top))


class ClusterView:
    """Samples the cluster's records into demo-dashboard snapshots."""

    def __init__(self, client: GfairClient, window_s: float) -> None:
        self._client = client
        self._window = ShareWindow(window_s)
        self._tally = Tally()
        self._started = time.monotonic()

    async def sample(self) -> DashboardFrame:
        shares = await self._client.shares()
        stride = await self._client.stride()
        jobs = await self._client.jobs()
        now = time.monotonic()
        if stride is not None:
            self._window.add_record(stride)
        await self._count_events()
        users = set(shares.users) if shares is not None else set()
        users |= {j.user for j in jobs if j.live}
        return DashboardFrame(
            elapsed_s=now - self._started,
            duration_s=0.0,
            shares=shares,
            stride=stride,
            jobs=jobs,
            received=self._window.received(),
            received_over_s=self._window.span_s(),
            tally=self._tally,
            # The demo knows its users' speedups; a cluster's users are whoever is active.
            speedups=dict.fromkeys(sorted(users), "-"),
        )

    async def _count_events(self) -> None:
        async for event in self._client.events(start=self._tally.jobs_sequence + 1):
            self._tally.jobs_sequence = event.sequence
            if isinstance(event.data, JobEvent):
                self._tally.count(event.data)
        async for sequence in self._client.cleared_trades(start=self._tally.sched_sequence + 1):
            self._tally.sched_sequence = sequence
            self._tally.trades += 1


def view(snapshot: DashboardFrame, window_s: float) -> Group:
    header = Text(
        f"gfair top: {len(snapshot.jobs)} job(s); received: {received_over(snapshot)} "
        f"(window {window_s:g}s)",
        style="bold",
    )
    return panels(header, snapshot)


async def _top(client: GfairClient, args: argparse.Namespace) -> int:
    cluster = ClusterView(client, args.window)
    console = output.console()
    snapshot = await cluster.sample()
    if args.once:
        # One read measures from split-stride's first count to its last tick, and says so.
        console.print(view(snapshot, args.window))
        return session.EXIT_OK
    if not console.is_terminal:
        while True:
            console.print(plain_line(snapshot), highlight=False, soft_wrap=True)
            await asyncio.sleep(args.refresh)
            snapshot = await cluster.sample()
    with Live(view(snapshot, args.window), console=console, refresh_per_second=4) as live:
        while True:
            await asyncio.sleep(args.refresh)
            live.update(view(await cluster.sample(), args.window))
