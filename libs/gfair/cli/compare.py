"""`gfair compare`: several policies on several workloads in one run, one table, one figure.

    gfair compare                                  # the standard set (gfair.sim.comparison)
    gfair compare --quick                          # three small generated workloads
    gfair compare --workloads 'gavel/*' --policies gandiva-fair max-min-fairness
    gfair compare --list                           # the workloads, their clusters and loads
    gfair compare --switch-cost 1 --migration-cost 60   # every policy charged real move costs

Prints one row per (workload, policy): completed jobs, average, median and 99th-percentile
JCT, makespan, the fraction of GPUs busy while jobs wait and of those idle that a waiting job
fits, Jain's index of ideal/actual JCT, the largest share error, the trading gain, moves to other
servers per job and per running job-hour, the average JCT relative to max-min-fairness's on
the same workload, and the replay's wall time. `--plot`
draws the JCT CDFs, `--json` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

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
)
from gfair.sim.replay import MAX_MIN_FAIRNESS, POLICY_NAMES
from gfair.sim.simulator import PlanError, SimulationStalled
from gfair.sim.trace import TraceError
from gfair.sim.workloads import Workload, default_philly_trace_path

_TABLE_WIDTH = 200


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="compare scheduling policies on several simulated workloads",
        description=(
            "Replay every chosen workload under every chosen policy (in virtual time, worker "
            "processes side by side) and print one table of JCT, efficiency and fairness."
        ),
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
    parser.add_argument("--plot", type=Path, help="draw the JCT CDFs here (PNG)")
    parser.add_argument("--json", type=Path, help="write the rows here (JSON)")
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
        workloads = select(sources, args.workloads, quick=args.quick)
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
        curves: dict[str, dict[str, list[float]]] = {}
        for outcome in outcomes:
            curves.setdefault(outcome.workload, {})[outcome.policy] = list(outcome.jcts_s)
        plotting().plot_jct_cdfs(curves, args.plot, f"JCT CDFs, {args.quantum:g} s quanta")
        console.print(f"JCT CDFs: {args.plot}", highlight=False)
    if args.json is not None:
        rows = []
        for outcome in outcomes:
            row = asdict(outcome)
            del row["jcts_s"]
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


def _print_workloads(console: Console, workloads: list[Workload]) -> None:
    for workload in workloads:
        console.print(f"{workload.name}: {workload.cluster} ({workload.note})", highlight=False)


def table(outcomes: list[Outcome]) -> Table:
    ratios = relative_jct(outcomes)
    view = Table(title="policies x workloads (JCT and makespan in hours)")
    headers = (
        "workload",
        "policy",
        "done",
        "avg",
        "p50",
        "p99",
        "makespan",
        "busy|wait",
        "idle|fit",
        "Jain JCT",
        "share err",
        "trade gain",
        "moves/job",
        "moves/run h",
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
            hours(outcome.p50_jct_s),
            hours(outcome.p99_jct_s),
            hours(outcome.makespan_s),
            fraction(outcome.busy_while_waiting),
            fraction(outcome.idle_while_fitting, 3),
            fraction(outcome.jct_jain_index),
            fraction(outcome.max_share_error, 3),
            f"{outcome.trading_gain:+.1%}",
            fraction(outcome.moves_per_job, 1),
            fraction(outcome.moves_per_running_hour),
            fraction(ratio),
            f"{outcome.wall_s:.1f}",
        )
    return view


def _short(policy: str) -> str:
    return "".join(word[0] for word in policy.split("-"))
