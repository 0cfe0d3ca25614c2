"""One quantum decision at scale: the decision kernel vs. one cluster-wide gang-aware stride.

Run: ``.venv/bin/python -m bench.quantum [--servers 1024] [--jobs 16384] [--repeat 20]``

The cluster has 1,024 servers of 8 GPUs (half K80, a quarter each P100 and V100) and 16,384
runnable jobs of 64 users (mostly 1 GPU, some 2/4/8-GPU gangs, ~1% 16-GPU multi-server gangs),
job types drawn from the Gavel table. Measured in the same run:

- the split-stride state machine's ``tick()`` (`gfair.core.scheduler`), driven by the
  simulator's `gandiva-fair` policy (first tick: after all the admissions, the servers just
  announced; then steady state), and how many jobs it moves to other servers per quantum;
- the policy's whole quantum around it: the auction's entitlements and trades before the tick,
  the simulated nodes confirming its stops and starts after;
- ``kernel.decide()`` alone, on the machine's snapshot after the last quantum;
- baseline: one gang-aware stride over all jobs of the cluster, sorting every job by pass every
  quantum and packing gangs first-fit onto servers, with no regard for where a job ran before;
  besides its time it reports how many jobs land on a different server than the quantum before;
- the paper's split stride (the simulator's `paper-split-stride` baseline: a stride per server,
  a central one for gangs spanning servers, load balancing), its whole quantum, and how many jobs
  its load balancing moves per quantum.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from gfair.core.cluster import Cluster, parse_cluster_spec
from gfair.core.kernel import DEFAULT_QUANTUM_S, decide
from gfair.core.scheduler import QuantumPlan
from gfair.gavel import load_throughputs
from gfair.sim.gandiva_fair_machine import GandivaFairMachine
from gfair.sim.policies.paper_split_stride import PaperSplitStride
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import TraceJob

QUANTUM_S = DEFAULT_QUANTUM_S


def _workload(jobs: int, users: int, job_types: list[str], seed: int) -> list[TraceJob]:
    rng = random.Random(seed)
    sizes = [1] * 80 + [2] * 9 + [4] * 6 + [8] * 4 + [16] * 1
    user_types = {f"u{n}": rng.choice(job_types) for n in range(users)}
    return [
        TraceJob(f"j{n}", f"u{n % users}", rng.choice(sizes), 0.0, 1e9, user_types[f"u{n % users}"])
        for n in range(jobs)
    ]


class _TimedTicks:
    """The machine's `tick`, timed: each call's milliseconds and how many jobs its plan moved
    (placed on other servers than they had; a first start is no move). The policy calls it as
    before."""

    def __init__(self, policy: GandivaFairMachine) -> None:
        self._machine = policy.machine
        self._tick = policy.machine.tick
        self.times: list[float] = []
        self.moved: list[int] = []
        policy.machine.tick = self  # type: ignore[method-assign]

    def __call__(self, now: float, heard_until: float | None = None) -> QuantumPlan:
        had = {key for key, job in self._machine.jobs.items() if job.servers}
        start = time.perf_counter()
        plan = self._tick(now, heard_until)
        self.times.append((time.perf_counter() - start) * 1000)
        self.moved.append(sum(1 for p in plan.placed if f"{p.user}.{p.job_id}" in had))
        return plan


@dataclass
class _Job:
    id: str
    gpus: int
    tickets: float
    pass_: float
    seq: int


def _baseline_quantum(cluster: Cluster, jobs: list[_Job]) -> dict[str, list[str]]:
    """Cluster-wide gang-aware stride: sort everything, pack first-fit onto servers."""
    free = {s.id: s.gpus for s in cluster.servers}
    size = max(s.gpus for s in cluster.servers)
    by_free: list[list[str]] = [[] for _ in range(size + 1)]  # free GPUs -> servers
    for s in cluster.servers:
        by_free[s.gpus].append(s.id)
    runs: dict[str, list[str]] = {}
    for job in sorted(jobs, key=lambda j: (j.pass_, j.seq)):
        if job.gpus > size:
            need = -(-job.gpus // size)
            if len(by_free[size]) < need:
                continue
            taken = [by_free[size].pop() for _ in range(need)]
            for server_id in taken:
                free[server_id] = 0
                by_free[0].append(server_id)
                runs.setdefault(server_id, []).append(job.id)
        else:
            slot = next((f for f in range(job.gpus, size + 1) if by_free[f]), None)
            if slot is None:
                continue
            server_id = by_free[slot].pop()
            free[server_id] = slot - job.gpus
            by_free[slot - job.gpus].append(server_id)
            runs.setdefault(server_id, []).append(job.id)
        job.pass_ += job.gpus / job.tickets
    return runs


def _time(fn: Callable[[], object], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=1024)
    parser.add_argument("--jobs", type=int, default=16384)
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    quarter = args.servers // 4
    cluster = parse_cluster_spec(
        f"k80:{args.servers - 2 * quarter}x8,p100:{quarter}x8,v100:{quarter}x8"
    )
    table = load_throughputs()
    specs = _workload(args.jobs, args.users, sorted(table), args.seed)
    policy = GandivaFairMachine(cluster, {}, table)
    ticks = _TimedTicks(policy)

    start = time.perf_counter()
    rejected = sum(not policy.submit(spec, 0.0).accepted for spec in specs)
    submit_ms = (time.perf_counter() - start) * 1000

    start = time.perf_counter()
    first = policy.plan(0.0)
    first_ms = (time.perf_counter() - start) * 1000
    quanta = iter(range(1, args.repeat + 1))
    steady = _time(lambda: policy.plan(next(quanta) * QUANTUM_S), args.repeat)
    snapshot = policy.machine.snapshot((args.repeat + 1) * QUANTUM_S)
    kernel = _time(lambda: decide(snapshot), args.repeat)

    jobs = [_Job(s.id, s.gpus, 1.0, 0.0, n) for n, s in enumerate(specs)]
    where: dict[str, str] = {}
    moved: list[int] = []

    def baseline() -> None:
        runs = _baseline_quantum(cluster, jobs)
        now = {job: server for server, js in runs.items() for job in js}
        moved.append(sum(1 for job, server in now.items() if where.get(job, server) != server))
        where.update(now)

    base = _time(baseline, args.repeat)

    paper = PaperSplitStride(cluster, SpeedModel.from_rates(table), {})
    for spec in specs:
        paper.submit(spec, 0.0)
    homes: dict[str, tuple[str, ...]] = {}
    paper_moved: list[int] = []

    def paper_quantum() -> None:
        paper.plan(0.0)
        now = paper.homes()
        paper_moved.append(
            sum(1 for job, servers in now.items() if homes.get(job, servers) != servers)
        )
        homes.update(now)

    paper_times = _time(paper_quantum, args.repeat)
    busy = len(first.runs)

    def row(name: str, times: list[float], note: str = "") -> None:
        print(
            f"{name:<52} median {statistics.median(times):8.2f} ms"
            f"   min {min(times):8.2f} ms   {note}"
        )

    print(
        f"cluster: {len(cluster.servers)} servers, {cluster.total_gpus} GPUs; "
        f"{len(specs)} jobs of {args.users} users ({rejected} rejected); "
        f"submitting all: {submit_ms:.0f} ms"
    )
    row("SplitStride.tick(), first (after admissions)", ticks.times[:1], f"{busy} servers busy")
    row(
        "SplitStride.tick(), steady state",
        ticks.times[1:],
        f"{statistics.median(ticks.moved[1:]):.0f} jobs change server per quantum (median)",
    )
    row("the policy's quantum, first (auction, tick, nodes)", [first_ms])
    row("the policy's quantum, steady state", steady)
    row("kernel.decide() alone", kernel)
    row(
        "baseline: cluster-wide gang-aware stride",
        base,
        f"{statistics.median(moved[1:] or moved):.0f} jobs change server per quantum (median)",
    )
    row(
        "the paper's split stride, its quantum",
        paper_times,
        f"{statistics.median(paper_moved[1:] or paper_moved):.0f} jobs moved per quantum (median)",
    )


if __name__ == "__main__":
    main()
