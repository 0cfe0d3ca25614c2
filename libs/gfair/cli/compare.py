"""`gfair compare`: several policies on several workloads in one run, one table, one figure each.

    gfair compare --trace jobs.csv --cluster v100:4x8,k80:8x4   # your own trace (gfair or Philly)
    gfair compare                                  # the standard set (gfair.sim.comparison)
    gfair compare --quick                          # three small generated workloads
    gfair compare --workloads 'gavel/*' --policies gandiva-fair max-min-fairness
    gfair compare --list                           # the workloads, their clusters and loads
    gfair compare --switch-cost 1 --migration-cost 60   # every policy charged real move costs

Prints one row per (workload, policy): completed jobs, average, 95th and 99th-percentile
JCT, mean queueing delay, makespan, finish-time fairness rho under both definitions
(`gfair.sim.finish_time`; worst, mean, fraction over 1 and 1.05, Jain's index), the GPUs idle
that a waiting job fits, the largest share error, the trading gain, moves to other servers per
job, the average JCT relative to max-min-fairness's on the same workload, and the replay's
wall time. `--json` writes the rows (each user's received and entitled share over time too),
`--csv` every row's numbers (the median JCT, GPUs busy while jobs wait and moves per running
job-hour as well), `--plot` one figure per workload.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gfair.cli.arguments import add_command
from gfair.cli.figures import plotting
from gfair.cli.switch_cost_options import add_switch_cost_options, switch_costs
from gfair.gavel import load_throughputs
from gfair.sim.comparison import (
    DEFAULT_POLICIES,
    PHILLY_DAYS,
    PHILLY_JOBS,
    PHILLY_WORK_GPU_H,
    QUANTUM_S,
    Outcome,
    Sources,
    compare,
    fraction,
    hours,
    relative_jct,
    select,
    trace_workload,
)
from gfair.sim.finish_time import DEFINITIONS, GANG_AWARE, THEMIS
from gfair.sim.replay import MAX_MIN_FAIRNESS, POLICY_NAMES
from gfair.sim.simulator import PlanError, SimulationStalled
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import TraceError, read_trace
from gfair.sim.workloads import Workload, default_philly_trace_path

_TABLE_WIDTH = 240


# What `gfair compare --help` says it does.
_DESCRIPTION = (
    "Replay every chosen workload under every chosen policy (in virtual time, worker "
    "processes side by side) and print one table of JCT, efficiency and fairness."
)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "compare", _DESCRIPTION)
    parser.add_argument(
        "--trace",
        type=Path,
        help="compare on this trace (gfair or Philly CSV, .xz/.gz read directly; `gfair trace "
        "convert` turns Gavel's into one) instead of the standard workloads; needs --cluster",
    )
    parser.add_argument("--cluster", help="with --trace: servers per generation, e.g. v100:4x8")
    parser.add_argument(
        "--jobs", type=int, metavar="N", help="with --trace: only its first N jobs by submission"
    )
    parser.add_argument(
        "--quick", action="store_true", help="three small generated workloads (seconds)"
    )
    parser.add_argument(
        "--policies",
        nargs="+",
        choices=POLICY_NAMES,
        default=list(DEFAULT_POLICIES),
        metavar="POLICY",
        help=f"default: {' '.join(DEFAULT_POLICIES)}",
    )
    parser.add_argument(
        "--workloads",
        nargs="+",
        default=[],
        metavar="PATTERN",
        help="workload names or shell patterns, e.g. 'philly-*/1:1:1' (default: all)",
    )
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument("--seed", type=int, default=0, help="seed of the workloads (default 0)")
    parser.add_argument(
        "--quantum", type=float, default=QUANTUM_S, metavar="SECONDS", help="default 360"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=_cpus(),
        metavar="N",
        help="replays run side by side (default: the CPUs available)",
    )
    parser.add_argument("--philly", type=Path, help="Philly trace (default: the reference data)")
    parser.add_argument(
        "--philly-jobs",
        type=int,
        default=PHILLY_JOBS,
        metavar="N",
        help=(
            "replay at most N consecutive jobs of each virtual cluster, around its median "
            f"submission (0: all; default {PHILLY_JOBS})"
        ),
    )
    parser.add_argument(
        "--philly-work",
        type=float,
        default=PHILLY_WORK_GPU_H,
        metavar="GPU_HOURS",
        help=(
            "and at most this much work (V100 GPU-hours) per virtual cluster "
            f"(0: no cap; default {PHILLY_WORK_GPU_H:g})"
        ),
    )
    parser.add_argument(
        "--philly-days",
        type=float,
        default=PHILLY_DAYS,
        metavar="DAYS",
        help=f"and submitted within DAYS days (0: no cap; default {PHILLY_DAYS:g})",
    )
    add_switch_cost_options(parser)
    parser.add_argument("--throughputs", type=Path, help="Gavel throughput JSON")
    parser.add_argument(
        "--plot",
        type=Path,
        help="draw each workload's figure here (PNG): JCT CDF, rho per job, user shares over "
        "time; with several workloads PATH-<workload>.png each",
    )
    parser.add_argument("--json", type=Path, help="write the rows here (JSON)")
    parser.add_argument("--csv", type=Path, help="write the rows' numbers here (CSV)")
    parser.set_defaults(func=run)


def _cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def run(args: argparse.Namespace) -> int:
    # A table this wide is cut to 80 columns when piped (the bench, CI logs): give it room.
    console = Console() if sys.stdout.isatty() else Console(width=_TABLE_WIDTH)
    errors = Console(stderr=True)
    if args.workers < 1 or not args.quantum > 0:
        print("gfair compare: error: --workers must be >= 1 and --quantum > 0", file=sys.stderr)
        return 2
    began = time.perf_counter()
    try:
        costs = switch_costs(args)
        throughput = load_throughputs(args.throughputs)
        sources = Sources(
            throughput=throughput,
            throughput_path=args.throughputs,
            philly_path=args.philly or default_philly_trace_path(),
            seed=args.seed,
            philly_jobs=args.philly_jobs,
            philly_work_gpu_h=args.philly_work,
            philly_days=args.philly_days,
        )
        workloads = _workloads(args, sources)
        if args.plot is not None:
            plotting()  # said now, not after the replays
    except (TraceError, ValueError, FileNotFoundError) as error:
        print(f"gfair compare: error: {error}", file=sys.stderr)
        return 2
    if not workloads:
        print("gfair compare: error: no workload matches", file=sys.stderr)
        return 2
    _print_workloads(console, workloads)
    if args.list:
        return 0
    policies = list(dict.fromkeys(args.policies))
    total = len(workloads) * len(policies)
    finished = 0

    def done(outcome: Outcome) -> None:
        nonlocal finished
        finished += 1
        errors.print(
            f"[{finished}/{total}] {outcome.workload} {outcome.policy}: {outcome.wall_s:.1f} s",
            highlight=False,
        )

    try:
        outcomes = compare(
            workloads,
            policies,
            throughput,
            quantum_s=args.quantum,
            workers=min(args.workers, total),
            done=done,
            costs=costs,
        )
    except (PlanError, SimulationStalled) as error:
        print(f"gfair compare: error: {error}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - began
    console.print(table(outcomes))
    replays = sum(outcome.wall_s for outcome in outcomes)
    console.print(
        f"{total} replays, {wall:.1f} s wall ({replays:.1f} s of replays, "
        f"{min(args.workers, total)} worker(s))",
        highlight=False,
    )
    if args.plot is not None:
        for path in _plot(outcomes, args.plot, args.quantum):
            console.print(f"figure: {path}", highlight=False)
    if args.csv is not None:
        rows = [outcome.row() for outcome in outcomes]
        with args.csv.open("w", encoding="utf-8", newline="") as stream:
            writer = csv.DictWriter(stream, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    if args.json is not None:
        rows = []
        for outcome in outcomes:
            row = asdict(outcome)
            del row["jcts_s"], row["rhos"]
            rows.append(row)
        document = {
            "quantum_s": args.quantum,
            "resume_s": costs.resume_s,
            "migration_s": costs.migration_s,
            "seed": args.seed,
            "wall_s": wall,
            "rows": rows,
        }
        args.json.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return 0


def _workloads(args: argparse.Namespace, sources: Sources) -> list[Workload]:
    if args.trace is None:
        if args.cluster is not None or args.jobs is not None:
            raise ValueError("--cluster and --jobs go with --trace")
        return select(sources, args.workloads, quick=args.quick)
    if args.cluster is None or args.quick or args.workloads:
        raise ValueError("--trace needs --cluster, and takes no --quick or --workloads")
    trace = read_trace(args.trace)
    if args.jobs is not None:
        if args.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
        trace = trace.head(args.jobs)
    return [trace_workload(trace, args.cluster, SpeedModel.from_rates(sources.throughput))]


def _plot(outcomes: list[Outcome], path: Path, quantum_s: float) -> list[Path]:
    """One figure per workload: `path` itself when there is one, else `path`-<workload>."""
    by_workload: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        by_workload.setdefault(outcome.workload, []).append(outcome)
    written: list[Path] = []
    for workload, group in by_workload.items():
        where = path
        if len(by_workload) > 1:
            where = path.with_name(f"{path.stem}-{workload.replace('/', '_')}{path.suffix}")
        plotting().plot_comparison(
            {outcome.policy: outcome.jcts_s for outcome in group},
            {d: {outcome.policy: outcome.rhos[d] for outcome in group} for d in DEFINITIONS},
            {outcome.policy: outcome.shares_over_time for outcome in group},
            where,
            f"{workload} on {group[0].cluster}, {quantum_s:g} s quanta",
        )
        written.append(where)
    return written


def _print_workloads(console: Console, workloads: list[Workload]) -> None:
    for workload in workloads:
        console.print(f"{workload.name}: {workload.cluster} ({workload.note})", highlight=False)


def table(outcomes: list[Outcome]) -> Table:
    ratios = relative_jct(outcomes)
    view = Table(
        title="policies x workloads (JCT, queueing and makespan in hours; rho "
        "themis|gang-aware, gfair.sim.finish_time)"
    )
    headers = (
        "workload",
        "policy",
        "done",
        "avg",
        "p95",
        "p99",
        "queue",
        "makespan",
        "rho max",
        "rho mean",
        "rho>1",
        "rho>1.05",
        "Jain rho",
        "idle|fit",
        "share err",
        "trade gain",
        "moves/job",
        f"÷{_short(MAX_MIN_FAIRNESS)}",
        "wall s",
    )
    for header in headers:
        view.add_column(header, justify="left" if header in ("workload", "policy") else "right")
    previous = ""
    for outcome in outcomes:
        first = outcome.workload != previous
        if first and previous:
            view.add_section()
        previous = outcome.workload
        ratio = ratios.get((outcome.workload, outcome.policy))
        view.add_row(
            outcome.workload if first else "",
            outcome.policy,
            f"{outcome.completed}/{outcome.jobs}",
            hours(outcome.avg_jct_s),
            hours(outcome.p95_jct_s),
            hours(outcome.p99_jct_s),
            hours(outcome.avg_queueing_s),
            hours(outcome.makespan_s),
            *(_both(outcome, stat) for stat in ("worst", "mean", "over_1", "over_1_05", "jain")),
            fraction(outcome.idle_while_fitting, 3),
            fraction(outcome.max_share_error, 3),
            f"{outcome.trading_gain:+.1%}",
            fraction(outcome.moves_per_job, 1),
            fraction(ratio),
            f"{outcome.wall_s:.1f}",
        )
    return view


def _both(outcome: Outcome, stat: str) -> str:
    """`stat` of rho under the Themis and the gang-aware definition, as "themis|gang"."""
    values = [
        getattr(outcome.finish_time_fairness.get(d), stat, None) for d in (THEMIS, GANG_AWARE)
    ]
    if stat in ("worst", "mean"):
        return "|".join("-" if value is None else f"{value:.3g}" for value in values)
    return "|".join(fraction(value) for value in values)


def _short(policy: str) -> str:
    return "".join(word[0] for word in policy.split("-"))
