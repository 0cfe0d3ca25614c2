"""A digest of every decision gandiva-fair takes on `gfair compare`'s standard workloads.

Run: ``.venv/bin/python scripts/decision_digest.py [--quanta 60 360]``

Prints one line per replay (workload, quantum): a SHA-256 over every job's start, end and
status and the replay's suspends, migrations, trades and plans, then one over all. Two trees
that print the same digests took the same decisions on every replay: the check a refactoring
of the scheduler must pass (issue 42), run on the tree before and after the change. It reads
only what a replay reports, so it works across renames inside the scheduler.
"""

from __future__ import annotations

import argparse
import hashlib
import sys

from gfair.core.cluster import parse_cluster_spec
from gfair.gavel import load_throughputs
from gfair.sim.comparison import Sources, select
from gfair.sim.replay import ReplayOptions, replay
from gfair.sim.workloads import default_philly_trace_path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quanta", type=float, nargs="+", default=[60.0, 360.0])
    args = parser.parse_args()
    throughput = load_throughputs(None)
    sources = Sources(
        throughput=throughput, throughput_path=None, philly_path=default_philly_trace_path()
    )
    total = hashlib.sha256()
    for workload in select(sources):
        cluster = parse_cluster_spec(workload.cluster)
        for quantum in args.quanta:
            result = replay(
                workload.trace, cluster, throughput, ReplayOptions(quantum_s=quantum)
            ).result
            digest = hashlib.sha256()
            for job in sorted(result.jobs, key=lambda job: job.id):
                digest.update(repr((job.id, job.start_s, job.end_s, job.status)).encode())
            counts = (result.suspends, result.migrations, result.trades, result.plans)
            digest.update(repr(counts).encode())
            total.update(digest.digest())
            print(f"{workload.name:28} {quantum:6g} s  {digest.hexdigest()[:16]}  {counts}")
    print(f"all {total.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
