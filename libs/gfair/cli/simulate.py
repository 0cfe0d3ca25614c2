"""`gfair simulate`: replay a job trace on a simulated cluster under one policy.

    gfair simulate --cluster v100:64x8,p100:64x8,k80:256x4 --policy gandiva-fair \\
        --report report.json --plot shares.png

Without `--trace` it replays the Philly trace packaged with gfair (`gfair.data.PHILLY_TRACE`).

With `--shares FILE` (docs/configuration.md, "Shares file") gandiva-fair divides the GPUs down
the file's accounts, the trace's user column naming the file's users; the per-account table
and the largest share error at each level of the tree are printed too.

Prints a per-user table and the summary at the end; `--report` writes the full JSON report
(`schemas/report.schema.json`), `--timeline` one JSON line per quantum per busy server, `--plot`
each user's share over time against its entitlement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gfair.cli.arguments import add_command, count, non_negative, positive
from gfair.cli.figures import plotting
from gfair.cli.switch_cost_options import add_switch_cost_options, switch_costs
from gfair.core.cluster import Cluster, parse_cluster_spec
from gfair.core.kernel import DEFAULT_QUANTUM_S
from gfair.data import PHILLY_TRACE
from gfair.gavel import load_throughputs
from gfair.journal import JournalFile
from gfair.shares import read_shares
from gfair.sim.replay import POLICY_NAMES, ReplayOptions, replay
from gfair.sim.report import Report
from gfair.sim.simulator import PlanError, SimulationStalled
from gfair.sim.timeline import TimelineWriter
from gfair.sim.trace import Trace, TraceError, read_trace

# Buckets of the share series (the report's, --plot's) start at this many quanta and
# double as needed.
_PLOT_BUCKET_QUANTA = 10


# What `gfair simulate --help` says it does.
_DESCRIPTION = (
    "Replay a gfair or Philly CSV trace (.xz/.gz read directly) on a simulated "
    "heterogeneous cluster under one scheduling policy, in virtual time."
)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "simulate", _DESCRIPTION)
    parser.add_argument(
        "--trace",
        type=Path,
        default=PHILLY_TRACE,
        help="trace CSV, gfair or Philly (default: the Philly trace packaged with gfair)",
    )
    parser.add_argument(
        "--cluster", required=True, help="servers per generation, e.g. v100:4x8,p100:4x8,k80:8x4"
    )
    parser.add_argument("--policy", choices=POLICY_NAMES, default="gandiva-fair")
    parser.add_argument(
        "--quantum",
        type=positive,
        default=DEFAULT_QUANTUM_S,
        metavar="SECONDS",
        help=f"default {DEFAULT_QUANTUM_S:g}",
    )
    parser.add_argument(
        "--tickets",
        action="extend",
        nargs="+",
        default=[],
        metavar="USER=N",
        help="tickets per user (override the trace's; others get 1)",
    )
    parser.add_argument(
        "--shares",
        type=Path,
        metavar="FILE",
        help="shares file (TOML): accounts in a tree above the trace's users",
    )
    parser.add_argument("--no-trading", action="store_true", help="gandiva-fair without trading")
    parser.add_argument("--report", type=Path, help="write the JSON report here")
    parser.add_argument("--timeline", type=Path, help="write per-quantum JSON lines here")
    parser.add_argument("--plot", type=Path, help="draw user shares over time (PNG)")
    parser.add_argument(
        "--journal",
        type=Path,
        metavar="PATH",
        help="write the gandiva-fair machine's inputs and outputs here (JSON Lines; gfair replay)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --rate-noise (default 0)")
    parser.add_argument(
        "--rate-noise",
        type=non_negative,
        default=0.0,
        metavar="FRACTION",
        help="relative noise on the rates the profiler observes (default 0: exact)",
    )
    parser.add_argument(
        "--until", type=positive, metavar="SECONDS", help="stop the clock at this trace time"
    )
    parser.add_argument(
        "--jobs", type=count, metavar="N", help="replay only the first N jobs by submission"
    )
    add_switch_cost_options(parser)
    parser.add_argument(
        "--throughputs",
        type=Path,
        help="Gavel throughput JSON (default: $GFAIR_THROUGHPUTS, else the packaged one)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    console = Console()
    errors = Console(stderr=True)
    try:
        outputs = {"--report": args.report, "--timeline": args.timeline, "--plot": args.plot}
        _check_outputs({**outputs, "--journal": args.journal})
        if args.journal is not None and args.policy != "gandiva-fair":
            raise ValueError("--journal records the gandiva-fair policy's machine only")
        tickets = _parse_tickets(args.tickets)
        tree = read_shares(args.shares) if args.shares is not None else None
        cluster = parse_cluster_spec(args.cluster)
        trace = read_trace(args.trace)
        if args.jobs is not None:
            trace = trace.head(args.jobs)
        throughput = load_throughputs(args.throughputs)
        options = ReplayOptions(
            policy=args.policy,
            quantum_s=args.quantum,
            trading=not args.no_trading,
            tickets=tickets,
            shares=tree,
            until_s=args.until,
            costs=switch_costs(args),
            seed=args.seed,
            rate_noise=args.rate_noise,
            series_bucket_s=args.quantum * _PLOT_BUCKET_QUANTA,
        )
        with _timeline(args.timeline, cluster) as timeline, _progress(errors, trace) as progress:
            journal = None
            if args.journal is not None:
                args.journal.unlink(missing_ok=True)
                journal = JournalFile(args.journal)
            try:
                outcome = replay(
                    trace,
                    cluster,
                    throughput,
                    options,
                    timeline=timeline,
                    progress=progress,
                    journal=journal,
                )
            finally:
                if journal is not None:
                    journal.close()
    except (TraceError, ValueError, FileNotFoundError, PlanError, SimulationStalled) as error:
        print(f"gfair simulate: error: {error}", file=sys.stderr)
        return 2
    report = outcome.report
    if args.report is not None:
        args.report.write_text(json.dumps(report.to_json(), indent=1) + "\n", encoding="utf-8")
    if args.plot is not None and outcome.series is not None:
        plotting().plot_shares(
            outcome.series, args.plot, f"{report.policy} on {report.cluster['spec']}"
        )
    _print_summary(console, report)
    return 0


def _check_outputs(outputs: dict[str, Path | None]) -> None:
    """`ValueError` for an output that could not be written: found now, not after the run."""
    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        if path is None:
            continue
        where = path.resolve()
        if where in seen:
            raise ValueError(f"{flag} {path}: also given to {seen[where]}")
        seen[where] = flag
        if path.is_dir():
            raise ValueError(f"{flag} {path}: is a directory")
        folder = where.parent
        if not folder.is_dir():
            raise ValueError(f"{flag} {path}: no directory {folder}")
        if not os.access(path if path.exists() else folder, os.W_OK):
            raise ValueError(f"{flag} {path}: not writable")
    plot = outputs.get("--plot")
    formats = plotting().PLOT_FORMATS if plot is not None else frozenset()
    if plot is not None and plot.suffix and plot.suffix.lower()[1:] not in formats:
        raise ValueError(
            f"--plot {plot}: unknown image format {plot.suffix}; "
            f"one of {', '.join('.' + f for f in sorted(formats))}"
        )


def _parse_tickets(items: list[str]) -> dict[str, float]:
    tickets: dict[str, float] = {}
    for item in items:
        user, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not sep or not user or not number > 0:
            raise ValueError(f"--tickets {item!r}: expected USER=N with N > 0")
        tickets[user] = number
    return tickets


@contextmanager
def _timeline(path: Path | None, cluster: Cluster) -> Iterator[TimelineWriter | None]:
    if path is None:
        yield None
        return
    with path.open("w", encoding="utf-8") as stream:
        yield TimelineWriter(stream, cluster)


@contextmanager
def _progress(console: Console, trace: Trace) -> Iterator[Callable[[float, int], None] | None]:
    if not console.is_terminal:
        yield None
        return
    columns = (
        TextColumn("[bold]simulating"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs done, day {task.fields[day]:.1f}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("simulate", total=len(trace.jobs), day=0.0)
        start = trace.jobs[0].submit_s if trace.jobs else 0.0

        def update(now: float, finished: int) -> None:
            bar.update(task, completed=finished, day=(now - start) / 86_400)

        yield update


def _print_summary(console: Console, report: Report) -> None:
    table = Table(title=f"{report.policy} on {report.cluster['spec']}")
    for column in ("user", "tickets", "entitled", "received", "throughput", "jobs", "avg JCT"):
        table.add_column(column, justify="left" if column == "user" else "right")
    for name, user in report.users.items():
        table.add_row(
            name,
            f"{user.tickets:g}",
            f"{user.entitled_share:.1%}",
            f"{user.received_share:.1%}",
            f"{user.effective_throughput:.2f}",
            str(user.jobs),
            _duration(user.avg_jct_s),
        )
    console.print(table)
    if report.accounts:
        _print_accounts(console, report)
    s, t = report.summary, report.timing
    summary = Table.grid(padding=(0, 2))
    summary.add_column(justify="right", style="bold")
    summary.add_column()
    rows = [
        ("jobs", f"{s.completed}/{s.jobs} completed, {s.rejected} rejected"),
        (
            "JCT",
            f"avg {_duration(s.avg_jct_s)}  p50 {_duration(s.p50_jct_s)}  "
            f"p95 {_duration(s.p95_jct_s)}  p99 {_duration(s.p99_jct_s)}  "
            f"slowdown {_number(s.avg_slowdown)}",
        ),
        (
            "cluster",
            f"makespan {_duration(s.makespan_s)}  utilization {s.utilization:.1%}  "
            f"GPUs busy while jobs wait {_percent(s.busy_while_waiting)}  "
            f"idle that a waiting job fits {_percent(s.idle_while_fitting)}",
        ),
        (
            "fairness",
            f"Jain {_number(s.jain_index)}  max share error {_number(s.max_share_error)}  "
            f"Jain of ideal/actual JCT {_number(s.jct_jain_index)}",
        ),
        (
            "switching",
            f"{s.suspends} suspends  {s.migrations} migrations  {s.trades} trades  "
            f"trading gain {s.trading_gain:+.1%}",
        ),
        (
            "simulation",
            f"{t.wall_s:.1f} s wall, {t.sched_cpu_s:.1f} s in the policy, "
            f"{t.decisions} decisions over {t.quanta} quanta, {t.jobs_per_s:.0f} jobs/s",
        ),
    ]
    for name, value in rows:
        summary.add_row(name, value)
    console.print(summary, highlight=False)


def _print_accounts(console: Console, report: Report) -> None:
    table = Table(title="accounts")
    for column in ("account", "tickets", "entitled", "received"):
        table.add_column(column, justify="left" if column == "account" else "right")
    for path, account in report.accounts.items():
        table.add_row(
            "  " * (account.level - 1) + path.rpartition("/")[2],
            f"{account.tickets:g}",
            f"{account.entitled_share:.1%}",
            f"{account.received_share:.1%}",
        )
    console.print(table)
    errors = "  ".join(
        f"level {level} {error:.3f}" for level, error in report.share_error_by_level.items()
    )
    console.print(f"largest share error per level: {errors}", highlight=False)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    if seconds < 86_400 * 2:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86_400:.1f}d"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"
