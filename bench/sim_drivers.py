"""`python -m bench.sim_drivers`: the simulator's two drivers of the decision kernel side by
side, `gandiva-fair` (`gfair.core.scheduler.GandivaFair`) and `gandiva-fair-machine` (the
live service's state machine, `gfair.core.split_stride`), on the same workload in one run
(docs/benchmarks.md, "The simulator through the state machine").

Each round replays the workload once per policy, in turn (`gfair.sim.comparison.run_one`: the
trading and the no-trading runs), and prints the CPU seconds of each; the summary is the
median and the least of the rounds, and the machine's over the facade's. Beside the CPU, what
they decided: the machine's average JCT over the facade's, and whether every job's JCT is the
same.

On 2026-11-28 (`--rounds 3`, a shared 2-core machine at a load of 2 to 3): the facade 4.95 s,
the machine 6.58 s (medians), 1.33x; the commit before that day's work gave 1.59 to 1.61x
(8.1 to 8.3 s for the machine), every job's JCT the same throughout.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from gfair.gavel import load_throughputs
from gfair.sim.comparison import QUANTUM_S, Outcome, Sources, run_one, select
from gfair.sim.replay import GANDIVA_FAIR, GANDIVA_FAIR_MACHINE
from gfair.sim.workloads import default_philly_trace_path

POLICIES = (GANDIVA_FAIR, GANDIVA_FAIR_MACHINE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="gavel/1:1:1", help="a `gfair compare` workload")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="the quick workloads")
    args = parser.parse_args(argv)
    throughput = load_throughputs(None)
    sources = Sources(throughput, None, default_philly_trace_path())
    found = select(sources, [args.workload], quick=args.quick)
    if len(found) != 1:
        print(f"bench.sim_drivers: {args.workload!r} names {len(found)} workloads", file=sys.stderr)
        return 2
    workload = found[0]
    table = {name: dict(rates) for name, rates in throughput.items()}
    cpu: dict[str, list[float]] = {policy: [] for policy in POLICIES}
    outcomes: dict[str, Outcome] = {}
    print(f"{workload.name} ({workload.note}), {QUANTUM_S:g} s quanta")
    print(f"{'round':>5} {'policy':<22} {'CPU s':>7} {'avg JCT h':>10}")
    for round_ in range(1, args.rounds + 1):
        for policy in POLICIES:
            began = time.process_time()
            outcome = run_one(workload, policy, table)
            cpu[policy].append(time.process_time() - began)
            outcomes[policy] = outcome
            jct = (outcome.avg_jct_s or 0.0) / 3600
            print(f"{round_:>5} {policy:<22} {cpu[policy][-1]:>7.2f} {jct:>10.3f}", flush=True)
    facade, machine = (cpu[policy] for policy in POLICIES)
    for label, pick in (("median", statistics.median), ("least", min)):
        print(
            f"{label:>6}: {pick(facade):.2f} s against {pick(machine):.2f} s,"
            f" machine / facade {pick(machine) / pick(facade):.2f}x"
        )
    ours, theirs = outcomes[GANDIVA_FAIR_MACHINE], outcomes[GANDIVA_FAIR]
    ratio = (ours.avg_jct_s or 0.0) / (theirs.avg_jct_s or 1.0)
    alike = "yes" if ours.jcts_s == theirs.jcts_s else "no"
    print(f"average JCT, machine / facade: {ratio:.4f}; every job's JCT the same: {alike}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
