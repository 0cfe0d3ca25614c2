"""`gfair trace convert`: a Gavel or Philly trace as gfair's trace CSV (docs/simulation.md).

    gfair trace convert --from philly philly_trace.csv.xz --jobs 1000 -o philly-1000.csv
    gfair trace convert --from gavel workload.trace -o gavel.csv

`gfair simulate` and `gfair compare --trace` read Philly's CSV directly too; converting it
fixes a sample and makes its mapping visible.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gfair.gavel import load_scaled_throughputs
from gfair.sim.trace import Trace, TraceError, read_gavel_trace, read_trace, write_trace

MAPPING = """mapping to gfair's columns
(submit_time_s,user,gpus,duration_s,job_type,tickets,job_id):
  philly (timestamp,duration,num_gpus,gpu_time,cluster[,job_id]): submit_time_s = timestamp
    in seconds since the earliest submission; user = cluster (the virtual cluster, a team);
    gpus = num_gpus; duration_s = duration (taken as the V100 run time); job_id = job_id, else
    the row's index; gpu_time is dropped; no job type, no tickets (1 each).
  gavel (Gavel's scheduler/utils.py parse_trace: ten tab-separated fields job_type, command,
    working_directory, num_steps_arg, needs_data_dir, total_steps, scale_factor,
    priority_weight, SLO, arrival_time): every job its own user job-<i> (line order from 0)
    with priority_weight as tickets; gpus = scale_factor; submit_time_s = arrival_time;
    duration_s = total_steps / the V100 steps/s of (job_type, scale_factor) in Gavel's
    throughput table (--throughputs); job_type kept; command, directory, data flag, SLO
    dropped."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "trace-convert",
        prog="gfair trace convert",
        help="convert a Gavel or Philly trace to gfair's CSV (also: gfair trace convert)",
        description="Write a Gavel or Philly trace as gfair's trace CSV.",
        epilog=MAPPING,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("input", type=Path, metavar="INPUT", help="the trace (.xz/.gz read)")
    parser.add_argument("--from", dest="form", choices=("gavel", "philly"), required=True)
    parser.add_argument("-o", "--output", type=Path, help="gfair CSV (default: stdout)")
    parser.add_argument("--jobs", type=int, metavar="N", help="only the first N by submission")
    parser.add_argument(
        "--throughputs", type=Path, help="Gavel throughput JSON (default: the packaged one)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        trace = _read(args)
        if args.jobs is not None:
            if args.jobs < 1:
                raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
            trace = trace.head(args.jobs)
        if args.output is None:
            write_trace(trace, sys.stdout)
        else:
            with args.output.open("w", encoding="utf-8", newline="") as stream:
                write_trace(trace, stream)
    except (TraceError, ValueError, OSError) as error:
        print(f"gfair trace convert: error: {error}", file=sys.stderr)
        return 2
    print(f"{len(trace.jobs)} jobs of {len(trace.users)} users", file=sys.stderr)
    return 0


def _read(args: argparse.Namespace) -> Trace:
    if args.form == "gavel":
        return read_gavel_trace(args.input, load_scaled_throughputs(args.throughputs))
    trace = read_trace(args.input)
    if trace.format != "philly":
        raise ValueError(f"{args.input}: not a Philly trace (its header is {trace.format}'s)")
    return trace
