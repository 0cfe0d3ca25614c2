"""`gfair compare --trace` on a 1,000-job trace: one command, five policies (issue 45's target:
under 30 s here).

Run: ``.venv/bin/python -m bench.compare_trace [--jobs 1000]``

Writes the trace (`gavel_trace` with `gfair.sim.comparison`'s six users, 3 jobs an hour, seed
0) into a temporary folder, then times the one command a researcher runs on it, with the JSON,
the CSV and the figure. The baseline beside it: the same five replays as five `gfair simulate`
runs, one per policy, as a comparison took before `--trace`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

from gfair.cli.main import main as gfair
from gfair.gavel import load_throughputs
from gfair.sim.comparison import USERS
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import write_trace
from gfair.sim.workloads import JobTypes, gavel_trace

CLUSTER = "v100:9x4,p100:9x4,k80:9x4"
POLICIES = ("gandiva-fair", "max-min-fairness", "tiresias", "fifo", "paper-split-stride")


def _timed(argv: list[str]) -> float:
    began = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = gfair(argv)
    if code != 0:
        raise SystemExit(f"gfair {' '.join(argv)} exited {code}")
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    args = parser.parse_args()
    throughput = load_throughputs(None)
    types = JobTypes.from_table(SpeedModel.from_rates(throughput), None)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        trace = out / "trace.csv"
        with trace.open("w") as stream:
            write_trace(gavel_trace(args.jobs, 3.0, types, 0, USERS), stream)
        written = ("--json", out / "c.json", "--csv", out / "c.csv", "--plot", out / "c.png")
        compare = ["compare", "--trace", str(trace), "--cluster", CLUSTER, "--policies"]
        one = _timed([*compare, *POLICIES, *map(str, written)])
        each = [
            _timed(["simulate", "--trace", str(trace), "--cluster", CLUSTER, "--policy", policy])
            for policy in POLICIES
        ]
    print(f"{args.jobs} jobs on {CLUSTER}, policies: {', '.join(POLICIES)}")
    print(f"gfair compare --trace (one command, JSON, CSV, figure): {one:6.1f} s")
    print(f"gfair simulate once per policy (baseline):              {sum(each):6.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
