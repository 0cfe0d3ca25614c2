"""`gfair demo`: a small heterogeneous cluster, four teams, a few minutes of fair sharing.

    gfair demo                      # v100:2x4,k80:2x4, 2.5 s quanta, 150 s
    gfair demo --duration 60 --plain

Starts a whole cluster on this machine (`gfair up`'s embedded cluster, simulated GPUs), submits
the workload of `demo_workload` (teams whose jobs gain 6.3x, 4.3x, 2.1x and 1.05x from a V100,
with different tickets), shows each team's received share against its entitlement, what runs on
each server and the trades in force, live on a terminal or as plain lines otherwise; then stops
the cluster and prints a summary and where the logs and traces are.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from gfair.bus.logs import configure_logging
from gfair.cli.arguments import add_command, positive
from gfair.cli.demo_dashboard import COUNTED
from gfair.cli.demo_run import DemoOptions, DemoResult, DemoRun, summary
from gfair.cli.demo_workload import JOBS, USERS, user_tickets
from gfair.client import ClientError, GfairClient
from gfair.embedded_cluster import ClusterError, ClusterOptions, EmbeddedCluster

_PLAIN_WIDTH = 140


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "demo", __doc__)
    parser.add_argument(
        "--duration", type=positive, default=150.0, metavar="SECONDS", help="default 150"
    )
    parser.add_argument(
        "--quantum", type=positive, default=2.5, metavar="SECONDS", help="default 2.5"
    )
    parser.add_argument("--cluster", default="v100:2x4,k80:2x4", help="default v100:2x4,k80:2x4")
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="where the cluster keeps its store, logs and traces "
        "(default: a new .gfair/demo-<time> here)",
    )
    parser.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    console = Console(highlight=False, force_terminal=False if args.plain else None)
    if not console.is_terminal:
        # Logs and pipes take long lines; 80 columns would fold every table.
        console = Console(highlight=False, force_terminal=False, width=_PLAIN_WIDTH)
    data_dir = args.data_dir or Path(".gfair") / f"demo-{datetime.now():%Y%m%d-%H%M%S}"
    options = ClusterOptions(
        cluster=args.cluster,
        quantum_s=args.quantum,
        data_dir=data_dir,
        user_tickets=user_tickets(),
    )
    try:
        options.servers()
    except ValueError as error:
        console.print(f"gfair demo: {error}")
        return 2
    # This process's own logs (cluster start and stop) go beside the services', not on screen.
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        with (logs / "demo.log").open("a") as log:
            configure_logging("gfair-demo", stream=log)
            return asyncio.run(_demo(options, args, console))
    except ClusterError as error:
        console.print(f"gfair demo: the cluster did not start: {error}")
        return 1
    except ClientError as error:
        console.print(f"gfair demo: {error}")
        return 1


async def _demo(options: ClusterOptions, args: argparse.Namespace, console: Console) -> int:
    _introduce(options, args.duration, console)
    run_task = asyncio.current_task()
    assert run_task is not None
    loop = asyncio.get_running_loop()
    # Ctrl-C ends the run early but still stops the cluster and summarises.
    interrupted = False

    def on_interrupt() -> None:
        nonlocal interrupted
        interrupted = True
        run_task.cancel()

    console.print("starting the cluster ...")
    async with EmbeddedCluster(options) as cluster:
        console.print(f"cluster up: NATS {cluster.nats_url}; submitting {len(JOBS)} jobs")
        loop.add_signal_handler(signal.SIGINT, on_interrupt)
        client = await GfairClient.connect(cluster.nats_url)
        demo = DemoRun(client, DemoOptions(duration_s=args.duration), console)
        try:
            async with client:
                try:
                    result = await demo.run()
                except asyncio.CancelledError:
                    if not interrupted:
                        raise
                    console.print("interrupted: stopping early")
                    result = demo.result
        finally:
            loop.remove_signal_handler(signal.SIGINT)
        console.print("stopping the cluster ...")
    _summarise(result, cluster, console)
    return 0


def _introduce(options: ClusterOptions, duration_s: float, console: Console) -> None:
    console.print(
        f"[bold]gfair demo[/]: cluster {options.cluster}, quantum {options.quantum_s:g} s, "
        f"{duration_s:g} s"
    )
    for user in USERS:
        jobs = [j for j in JOBS if j.user == user.name]
        gpus = sum(j.gpus for j in jobs)
        console.print(
            f"  {user.name:<7} tickets {user.tickets:g}, {user.job_type} "
            f"(gains {user.speedup} from a V100), {len(jobs)} jobs asking {gpus} GPUs"
        )


def _summarise(result: DemoResult, cluster: EmbeddedCluster, console: Console) -> None:
    console.print(summary(result))
    snapshot = result.snapshot
    if snapshot is not None:
        jobs = snapshot.jobs
        done = sum(1 for j in jobs if j.state.value == "completed")
        counts = ", ".join(f"{name} {snapshot.tally.events[name]}" for name in COUNTED)
        console.print(f"jobs: {done} of {len(jobs)} completed in {result.elapsed_s:.0f} s")
        console.print(f"scheduler actions: {counts}")
        console.print(f"trades cleared: {snapshot.tally.trades}")
        shares = snapshot.shares
        for trade in shares.trades if shares is not None else ():
            console.print(
                f"  in force: {trade.buyer} holds {trade.quantity:.2f} more {trade.fast_pool} "
                f"GPUs bought from {trade.seller} at {trade.price:.2f} {trade.slow_pool} each"
            )
    console.print(f"logs:   {cluster.logs_dir}")
    console.print(f"traces: {cluster.span_file}")
