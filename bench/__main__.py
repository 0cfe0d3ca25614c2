"""`python -m bench` (`make bench`): every benchmark in turn, each with its in-run baseline."""

from __future__ import annotations

import subprocess
import sys

BENCHMARKS = (
    "bench.quantum",
    "bench.machine",
    "bench.policies",
    "bench.compare_trace",
    "bench.bus",
    "bench.live",
    "bench.hostile",
    "bench.switching",
    "bench.stride_store",
    "bench.heartbeat_backlog",
    "bench.progress",
    "bench.flood",
    "bench.idle",
    "bench.scale",
)


def main() -> int:
    failed = 0
    for module in BENCHMARKS:
        print(f"\n=== {module} ===", flush=True)
        # One process each: a benchmark's servers and threads never skew the next one.
        failed |= subprocess.call([sys.executable, "-m", module]) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
