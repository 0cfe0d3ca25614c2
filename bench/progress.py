"""What a progress report costs the services (issue 26): CPU seconds per 1,000 `JobProgress`
reports in the profiler and in the failure detector, the two services that read every one.

Run: ``.venv/bin/python -m bench.progress [--jobs 2000] [--seconds 30] [--baseline REF]``

A cluster of `--jobs` running jobs (8 GPUs a server, the servers V100, P100, K80 and A100 in
turn, jobs of 1, 2 and 4 GPUs of the Gavel table's types, 100 users) reports its progress once a
second per job for `--seconds` seconds, as the node executors do: the rate each window (the
Gavel rate within 1%), the steps so far, a run's first report with its first mini-batch's time.
The jobs are accepted and started first, with both services running; then the reports are
published to the in-memory bus while no service reads them; then each service starts alone and
handles them all. What is timed (`time.process_time`, every thread of the process) is its
handling, from the moment it starts reading to the moment every report is acknowledged and its
spans exported: decoding, the handler, its records, acknowledgements, and the spans and
metrics a service of `gfair up` exports (to a JSON Lines file here, as there).

With `--baseline REF` the same measurement runs on the sources of a git revision as well
(`git archive` into a temporary folder), each tree in a process of its own, alternately
`--repeat` times, and the table shows both side by side (the fastest of the repeats, the box
being shared). `--profile profiler` (or `failure-detector`) prints where this tree's handling
spends its time (cProfile, by own time) instead.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATIONS = ("v100", "p100", "k80", "a100")
GPUS_PER_SERVER = 8
JOB_GPUS = (1, 1, 1, 1, 1, 1, 2, 4)
USERS = 100


@dataclass(frozen=True)
class Job:
    user: str
    job_id: str
    node_id: str
    generation: str
    job_type: str
    gpus: int
    rate: float  # mini-batches per second, all its GPUs together


def workload(jobs: int, table: dict[str, dict[str, float]]) -> list[Job]:
    types = sorted(t for t, rates in table.items() if all(g in rates for g in GENERATIONS[:3]))
    out: list[Job] = []
    server, used = 0, 0
    for index in range(jobs):
        gpus = JOB_GPUS[index % len(JOB_GPUS)]
        if used + gpus > GPUS_PER_SERVER:
            server, used = server + 1, 0
        used += gpus
        generation = GENERATIONS[server % len(GENERATIONS)]
        job_type = types[index % len(types)]
        out.append(
            Job(
                user=f"user-{index % USERS:03d}",
                job_id=f"job-{index:05d}",
                node_id=f"node-{server:04d}",
                generation=generation,
                job_type=job_type,
                gpus=gpus,
                # The Gavel table has no A100: half as fast again as a V100 there.
                rate=table[job_type].get(generation, table[job_type]["v100"] * 1.5) * gpus,
            )
        )
    return out


# ----- one tree's measurement (a child process) ---------------------------------------------


def _drained(bus: object, consumers: Sequence[tuple[str, str]]) -> bool:
    # The bus's own `unread` walks the stream from the consumer's cursor: polled while 60,000
    # reports wait it would cost more than some of what is measured. Read the cursor instead.
    states = bus._consumers  # type: ignore[attr-defined]
    for key in consumers:
        state = states.get(key)
        if state is None or state.pending or state.cursor <= state.stream.last_sequence:
            return False
    return True


async def _measure(args: argparse.Namespace) -> dict[str, object]:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from gfair.bus.memory_bus import InMemoryBus
    from gfair.bus.publisher import EventPublisher
    from gfair.bus.runner import RunnerSettings
    from gfair.bus.runtime import ServiceRuntime
    from gfair.bus.service import Service
    from gfair.bus.span_file import JsonlSpanExporter
    from gfair.events.jobs import JobAccepted, JobLaunch, JobProgress, JobStarted
    from gfair.events.nodes import GpuInfo, NodeRegistered
    from gfair.gavel import load_throughputs
    from gfair_services import failure_detector, profiler

    folder = Path(tempfile.mkdtemp(prefix="bench-progress-"))
    # As `gfair up` runs a service: its spans to a file, its logs at info (`main`, to nowhere).
    provider = TracerProvider(resource=Resource.create({"service.name": "bench"}))
    if not args.no_spans:
        provider.add_span_processor(BatchSpanProcessor(JsonlSpanExporter(folder / "spans.jsonl")))
        trace.set_tracer_provider(provider)

    rng = random.Random(args.seed)
    jobs = workload(args.jobs, load_throughputs())
    bus = InMemoryBus()
    settings = RunnerSettings()  # the services' defaults
    builds: dict[str, Callable[[], Service]] = {
        "profiler": lambda: profiler.build_service(profiler.Settings()),
        "failure-detector": lambda: failure_detector.build_service(failure_detector.Settings()),
    }
    node = EventPublisher(bus, "node-executor")

    # Accepted and started, with both services reading.
    runtimes = [ServiceRuntime(build(), bus, settings=settings) for build in builds.values()]
    for runtime in runtimes:
        await runtime.start()
    nodes = sorted({(j.node_id, j.generation) for j in jobs})
    for node_id, generation in nodes:
        gpus = tuple(
            GpuInfo(
                index=i,
                uuid=f"GPU-{node_id}-{i}",
                name=f"Simulated {generation}",
                generation=generation,
                memory_bytes=16 << 30,
            )
            for i in range(GPUS_PER_SERVER)
        )
        await node.publish(
            NodeRegistered(
                node_id=node_id,
                hostname=node_id,
                gpus=gpus,
                heartbeat_interval_s=5.0,
                simulated=True,
            )
        )
    for job in jobs:
        await node.publish(
            JobAccepted(
                user=job.user,
                job_id=job.job_id,
                gpus=job.gpus,
                job_type=job.job_type,
                launch=JobLaunch(command=("true",)),
            )
        )
    parents: dict[str, str] = {}
    for job in jobs:
        started = await node.publish(
            JobStarted(
                user=job.user,
                job_id=job.job_id,
                node_id=job.node_id,
                gpu_indices=tuple(range(job.gpus)),
                attempt=1,
            )
        )
        parents[job.job_id] = started.id
    consumers = {
        name: [(r.consumer.stream, r.consumer.durable) for r in build().routes]
        for name, build in builds.items()
    }
    every = [key for keys in consumers.values() for key in keys]
    # The in-memory bus signals no acknowledgement: polled.
    while not _drained(bus, every):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    for runtime in runtimes:
        await runtime.stop()

    # The reports, while no service reads: a second at a time, every job once a second.
    reports = 0
    for second in range(args.seconds):
        for job in jobs:
            rate = job.rate * (1 + rng.uniform(-0.01, 0.01))
            await node.publish(
                JobProgress(
                    user=job.user,
                    job_id=job.job_id,
                    node_id=job.node_id,
                    generation=job.generation,
                    attempt=1,
                    minibatches_per_s=rate,
                    iterations=int(job.rate * (second + 1)) + 1,
                    window_s=1.0,
                    first_step_s=12.5 if second == 0 else None,
                ),
                correlation_id=parents[job.job_id],
            )
            reports += 1

    results: dict[str, object] = {
        "reports": reports,
        "jobs": args.jobs,
        "seconds": args.seconds,
        "gfair": _gfair_file(),
    }
    for name, build in builds.items():
        if args.profile not in (None, name):
            continue
        runtime = ServiceRuntime(build(), bus, settings=settings)
        await runtime.start()
        profile = cProfile.Profile() if args.profile == name else None
        cpu, wall = time.process_time(), time.perf_counter()
        if profile is not None:
            profile.enable()
        while not _drained(bus, consumers[name]):  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        provider.force_flush()
        if profile is not None:
            profile.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        await runtime.stop()
        results[name] = {"cpu_s": cpu, "wall_s": wall}
        if profile is not None:
            stats = pstats.Stats(profile, stream=sys.stderr)
            stats.sort_stats("tottime").print_stats(30)
            stats.sort_stats("cumulative").print_stats(40)
    results["published"] = _published(bus)
    provider.shutdown()
    return results


def _gfair_file() -> str:
    import gfair

    return str(Path(gfair.__file__).parent)


def _published(bus: object) -> dict[str, int]:
    """What the services published while handling the reports, by event type."""
    from gfair.events.codec import decode

    counts: dict[str, int] = {}
    for message in bus.stream_messages("GFAIR_SCHED"):  # type: ignore[attr-defined]
        kind = decode(message.data).envelope.type
        counts[kind] = counts.get(kind, 0) + 1
    return counts


# ----- the table (the parent process) --------------------------------------------------------


def _tree_of(ref: str, into: Path) -> Path:
    """The sources of git revision `ref` (or a folder holding a checkout) to run."""
    if Path(ref).is_dir():
        return Path(ref).resolve()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "libs", "services"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _run_tree(tree: Path, args: argparse.Namespace) -> dict[str, object]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "libs"), str(tree / "services"), str(ROOT)])
    command = [
        sys.executable,
        "-m",
        "bench.progress",
        "--child",
        f"--jobs={args.jobs}",
        f"--seconds={args.seconds}",
        f"--seed={args.seed}",
        *(["--no-spans"] if args.no_spans else []),
    ]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def _row(
    label: str, results: Sequence[dict[str, object]], cell: Callable[[dict[str, object]], str]
) -> str:
    return f"| {label} | " + " | ".join(cell(r) for r in results) + " |"


def _table(names: Sequence[str], results: Sequence[dict[str, object]]) -> str:
    reports = int(results[0]["reports"])  # type: ignore[call-overload]

    def service(name: str, what: str) -> Callable[[dict[str, object]], str]:
        def cell(result: dict[str, object]) -> str:
            measured = result[name]
            assert isinstance(measured, dict)
            value = float(measured[what])
            return f"{value:.2f}" if what == "wall_s" else f"{value / reports * 1000:.3f}"

        return cell

    def total(result: dict[str, object]) -> str:
        cpu = sum(float(result[n]["cpu_s"]) for n in SERVICES)  # type: ignore[index]
        return f"{cpu / reports * 1000:.3f}"

    def published(result: dict[str, object]) -> str:
        counts = result["published"]
        assert isinstance(counts, dict)
        return " / ".join(
            str(counts.get(kind, 0))
            for kind in ("gfair.profile.updated.v1", "gfair.switch_costs.updated.v1")
        )

    lines = [
        f"{reports:,} progress reports: {results[0]['jobs']:,} running jobs, one a second each "
        f"for {results[0]['seconds']} s",
        "",
        "| | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        _row("profiler: CPU s per 1,000 reports", results, service("profiler", "cpu_s")),
        _row("profiler: wall s for all", results, service("profiler", "wall_s")),
        _row(
            "failure detector: CPU s per 1,000 reports",
            results,
            service("failure-detector", "cpu_s"),
        ),
        _row("failure detector: wall s for all", results, service("failure-detector", "wall_s")),
        _row("both: CPU s per 1,000 reports", results, total),
        _row("profiles / switch costs published (whole run)", results, published),
    ]
    return "\n".join(lines)


SERVICES = ("profiler", "failure-detector")


def _fastest(runs: Sequence[dict[str, object]]) -> dict[str, object]:
    best = dict(runs[0])
    for name in SERVICES:
        best[name] = min((r[name] for r in runs), key=lambda m: m["cpu_s"])  # type: ignore[index,return-value]
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000, help="running jobs")
    parser.add_argument("--seconds", type=int, default=30, help="seconds of reports")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--baseline", help="a git revision (or a checkout) to compare with")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each tree, alternately")
    parser.add_argument("--profile", choices=SERVICES, help="cProfile one service (this tree)")
    parser.add_argument(
        "--no-spans", action="store_true", help="export no spans (a service without tracing)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child or args.profile:
        from gfair.bus.logs import configure_logging

        with open(os.devnull, "w") as nowhere:
            configure_logging("bench", level="INFO", fmt="json", stream=nowhere)
            result = asyncio.run(_measure(args))
        print(json.dumps(result), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="bench-progress-tree-") as scratch:
        trees: list[tuple[str, Path]] = []
        if args.baseline:
            trees.append((f"before ({args.baseline})", _tree_of(args.baseline, Path(scratch))))
        trees.append(("after (this tree)", ROOT))
        runs: dict[str, list[dict[str, object]]] = {name: [] for name, _ in trees}
        for _ in range(args.repeat):
            for name, tree in trees:
                result = _run_tree(tree, args)
                print(f"{name}: gfair from {result['gfair']}", file=sys.stderr, flush=True)
                runs[name].append(result)
        print(_table(list(runs), [_fastest(r) for r in runs.values()]))


if __name__ == "__main__":
    main()
