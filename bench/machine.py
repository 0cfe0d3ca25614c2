"""`python -m bench.machine`: what the split-stride state machine (`gfair.core.scheduler`)
costs per event at scale, without the bus: one admission, one release report and one tick on
1,000 servers of 8 GPUs with 2,000 and 20,000 jobs admitted (docs/benchmarks.md); and what the
split-stride service then pays to write its record after a batch of events that changed ten
jobs (`gfair_services.split_stride.record`, stored with `save_stride` in an in-memory bucket).

The machine is restored with its jobs (as after a restart), ticked once and every start
confirmed, so that the measured events meet a running cluster. Each cost is the median of
`--repeat` events (a tick's: of three). Beside them, in the same run, an admission and a release
with the kernel's `backfill` placing every running job again, one by one, as it did before
2026-11-29 (its baseline). Run it on two trees in one shell command to compare them (the numbers
of one run only compare with each other; the record write has no baseline of its own).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from gfair.bus.memory_kv import InMemoryKeyValue
from gfair.bus.topology import BucketSpec
from gfair.core.kernel import DEFAULT_QUANTUM_S, backfilling
from gfair.core.scheduler import (
    Admitted,
    Exited,
    Node,
    Phase,
    Saved,
    SchedulerConfig,
    SchedulerJob,
    SplitStride,
    Started,
)
from gfair.core.throughput import ThroughputEstimator
from gfair.events import NodeState
from gfair.state.buckets import STRIDE
from gfair.state.stride_record import save_stride
from gfair_services.inventory import NodeEntry, NodeInventory
from gfair_services.split_stride.record import Records

QUANTUM_S = DEFAULT_QUANTUM_S
T0 = datetime(2026, 11, 29, tzinfo=UTC)
GANGS = (1, 1, 2, 4, 8)  # GPUs of the jobs in turn
USERS = 50


def build(servers: int, jobs: int) -> SplitStride:
    """A machine on `servers` 8-GPU servers with `jobs` admitted, ticked once and confirmed."""
    nodes = tuple(Node(f"v100-{i}", "v100", tuple(range(8))) for i in range(servers))
    saved = Saved(usage_since=0.0, nodes=nodes)
    for n in range(jobs):
        user = f"u{n % USERS}"
        job = SchedulerJob(user, f"j{n}", GANGS[n % len(GANGS)], 1.0, None, seq=n + 1)
        saved.jobs[job.key] = job
    saved.seq = jobs
    machine = SplitStride(SchedulerConfig(quantum_s=QUANTUM_S), ThroughputEstimator(), saved)
    machine.tick(QUANTUM_S)
    _confirm(machine, QUANTUM_S + 1)
    return machine


def _confirm(machine: SplitStride, now: float) -> None:
    for job in list(machine.jobs.values()):
        for stay in list(job.stays.values()):
            if stay.phase is Phase.STARTING:
                machine.apply(
                    Started(
                        user=job.user,
                        job_id=job.job_id,
                        now=now,
                        node_id=stay.node_id,
                        attempt=stay.attempt,
                        gpu_indices=stay.gpu_indices,
                        at=now,
                    )
                )


def _timed(action: Callable[[], object]) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


@contextlib.contextmanager
def _placed_one_by_one() -> Iterator[None]:
    """The baseline: `backfill` places every running job again before it fills."""
    kept = backfilling._held_in_place
    backfilling._held_in_place = lambda cycle, holding: None
    try:
        yield
    finally:
        backfilling._held_in_place = kept


def _admissions(machine: SplitStride, now: float, first: int, repeat: int) -> list[float]:
    return [
        _timed(
            lambda i=i: machine.apply(
                Admitted(
                    user=f"u{i % USERS}",
                    job_id=f"new{i}",
                    now=now,
                    gpus=1,
                    weight=1.0,
                    job_type=None,
                )
            )
        )
        for i in range(first, first + repeat)
    ]


def _releases(machine: SplitStride, now: float, repeat: int) -> list[float]:
    # A node reports a running job's process ended: its GPUs go to waiting jobs (a fill).
    running = [
        (job, stay)
        for job in machine.jobs.values()
        for stay in job.stays.values()
        if stay.phase is Phase.RUNNING
    ][:repeat]
    return [
        _timed(
            lambda job=job, stay=stay: machine.apply(
                Exited(
                    user=job.user,
                    job_id=job.job_id,
                    now=now,
                    node_id=stay.node_id,
                    attempt=stay.attempt,
                    at=now,
                )
            )
        )
        for job, stay in running
    ]


def _writes(machine: SplitStride, repeat: int) -> list[float]:
    """Seconds to build and store the record after each of `repeat` batches that changed ten
    jobs (the first write, of every job, not counted)."""
    inventory = NodeInventory(
        NodeEntry(node.node_id, node.generation, node.gpu_indices, NodeState.READY, T0)
        for node in machine.nodes.values()
    )

    async def run() -> list[float]:
        bucket = InMemoryKeyValue(BucketSpec(name=STRIDE.name))
        records = Records()
        stored = await save_stride(
            bucket, records.record(machine, inventory, "bench", (), T0), None, None
        )
        records.stored()
        keys = list(machine.jobs)[:10]
        took = []
        for _ in range(repeat):
            for key in keys:
                machine.touch(key)
            began = time.perf_counter()
            built = records.record(machine, inventory, "bench", (), T0)
            stored = await save_stride(
                bucket, built, stored.revision, stored.record, changed_jobs=records.changed_jobs
            )
            records.stored()
            took.append(time.perf_counter() - began)
        return took

    return asyncio.run(run())


def measure(servers: int, jobs: int, repeat: int) -> dict[str, float]:
    """Median seconds of an admission, a release report, a tick and a record write; of an
    admission and a release with the baseline's `backfill`."""
    machine = build(servers, jobs)
    now = 2 * QUANTUM_S
    with _placed_one_by_one():
        admissions_before = _admissions(machine, now, 0, repeat)
        releases_before = _releases(machine, now, repeat)
    admissions = _admissions(machine, now, repeat, repeat)
    releases = _releases(machine, now, repeat)
    ticks = []
    for k in range(3):
        at = now + QUANTUM_S * (k + 1)
        ticks.append(_timed(lambda at=at: machine.tick(at)))
        _confirm(machine, at + 1)
    return {
        "admission": statistics.median(admissions),
        "admission before": statistics.median(admissions_before),
        "release": statistics.median(releases),
        "release before": statistics.median(releases_before),
        "tick": statistics.median(ticks),
        "record write": statistics.median(_writes(machine, repeat)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument(
        "--jobs", type=lambda t: [int(n) for n in t.split(",")], default=[2000, 2450, 20000]
    )
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    heads = (
        "admission",
        "admission before",
        "release",
        "release before",
        "tick",
        "record write",
    )
    print(f"{'servers':>8} {'jobs':>7}" + "".join(f" {h + ' ms':>19}" for h in heads))
    for jobs in args.jobs:
        got = measure(args.servers, jobs, args.repeat)
        cells = "".join(f" {got[h] * 1e3:>19.1f}" for h in heads)
        print(f"{args.servers:>8} {jobs:>7}{cells}", flush=True)


if __name__ == "__main__":
    main()
