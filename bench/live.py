"""The live path on loopback: submit-to-running latency, and submissions admitted per second.

Run: ``.venv/bin/python -m bench.live [--cluster v100:2x8] [--latency-jobs 40] [--rate 200]
[--seconds 5] [--time-limit 240]``

Starts a whole cluster as `gfair up` does (embedded nats-server, the five scheduler services,
the query service and one node executor per server, simulated GPUs, a 60 s quantum so that
time-slicing does not interfere) and measures, in the same run:

- the bus alone, as baseline: raw JetStream (publish, durable pull, ack) and the gfair runtime
  (`EventPublisher` -> `HandlerRunner`) publish-to-handle latency on the same server, one
  publisher, with the cluster idle (``bench.bus``); its heartbeats reach the failure detector,
  so the cluster is let settle (every consumer drained) before the live measurements;
- submit -> running with free GPUs: one job at a time (``true``, so the GPU is free again at
  once), latency from the `JobSubmitted` envelope's time to the node executor's `JobStarted`
  (all processes share one clock), split into its hops: placement (submitted -> accepted),
  split-stride (accepted -> the kernel's placement and `StartCommand`) and the node executor
  (command -> process started);
- sustained admission: every GPU busy with a long job, then submissions published at
  ``--rate`` per second for ``--seconds``, each when it is due whether or not the ones before
  are stored yet (as many independent submitters would); each must be answered (`JobAccepted`
  or `JobRejected`). Reports the rate offered, answers per second, submit -> accepted latency,
  and how many were never answered (lost) after a drain of 60 s.

Everything shares this machine's cores: the numbers are what one box does, not a cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import nats
from nats.aio.msg import Msg

from bench.bus import bench_raw_jetstream, bench_runtime
from bench.process_cpu import process_stat
from gfair.bus.logs import configure_logging
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.publisher import EventPublisher
from gfair.bus.transport import PubAck
from gfair.core.kernel import DEFAULT_QUANTUM_S
from gfair.embedded_cluster import ClusterOptions, EmbeddedCluster
from gfair.events.subjects import STREAMS
from gfair.events.submission import JobCancelRequested, JobSubmitted

USER = "bench"
LONG_JOB = [sys.executable, "-m", "gfair.sdk.synthetic", "--duration-s", "1000000"]
# Submissions published but not yet stored, at most: beyond it the offered rate falls behind.
MAX_IN_FLIGHT = 1000


@dataclass
class Timeline:
    """When each event of each job was published (envelope time), from a core subscription."""

    seen: dict[str, dict[str, datetime]] = field(default_factory=lambda: defaultdict(dict))
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_message(self, msg: Msg) -> None:
        try:
            envelope = json.loads(msg.data)
            kind = envelope["type"].split(".")[2]
            job_id = envelope["data"]["job_id"]
            at = datetime.fromisoformat(envelope["time"])
        except (ValueError, KeyError, IndexError):
            return
        self.seen[job_id].setdefault(kind, at)
        self.changed.set()

    async def wait(self, job_id: str, kinds: set[str], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not kinds & set(self.seen.get(job_id, {})):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except TimeoutError:
                return False
        return True

    def span_ms(self, job_id: str, first: str, last: str) -> float | None:
        events = self.seen.get(job_id, {})
        if first not in events or last not in events:
            return None
        return (events[last] - events[first]).total_seconds() * 1000


def percentiles(values: list[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"p50 {statistics.median(ordered):7.1f} ms   p99 {p99:7.1f} ms   (n={len(ordered)})"


async def measure_latency(
    publisher: EventPublisher, timeline: Timeline, jobs: int, time_limit: float, user: str = USER
) -> list[float]:
    """Submit -> running (ms) of `jobs` jobs one at a time, each let end first; prints them
    with their hops and returns them."""
    deadline = time.monotonic() + time_limit
    ids = []
    for n in range(jobs):
        if time.monotonic() > deadline:
            break
        job_id = f"latency-{n}"
        await publisher.publish(JobSubmitted(user=user, job_id=job_id, gpus=1, command=("true",)))
        ids.append(job_id)
        # One at a time, on an idle cluster: wait until it ran and ended.
        await timeline.wait(job_id, {"completed", "failed", "rejected"}, 30)
    total = [v for j in ids if (v := timeline.span_ms(j, "submitted", "started")) is not None]
    print(f"  submitted -> started (running)   {percentiles(total)}")
    for name, first, last in (
        ("placement: submitted -> accepted", "submitted", "accepted"),
        ("split-stride: accepted -> command", "accepted", "start"),
        ("executor: command -> started", "start", "started"),
    ):
        hop = [v for j in ids if (v := timeline.span_ms(j, first, last)) is not None]
        print(f"    {name:<32} {percentiles(hop)}")
    missing = len(ids) - len(total)
    if missing:
        print(f"  ({missing} of {len(ids)} never reported started)")
    return total


async def settle(connection: nats.NATS, timeout_s: float = 60.0) -> float:
    """Until every durable consumer of the cluster has nothing pending; the seconds it took."""
    js = connection.jetstream()
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        busy = 0
        for stream in STREAMS:
            for info in await js.consumers_info(stream.name):
                busy += (info.num_pending or 0) + (info.num_ack_pending or 0)
        if not busy:
            break
        await asyncio.sleep(0.2)
    return time.monotonic() - began


def brokers_of(parent: int) -> dict[str, int | None]:
    """The nats-server processes `parent` started (Linux): they work for every event too."""
    found: dict[str, int | None] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name, rest = (entry / "stat").read_text().split(") ", 1)
        except (OSError, ValueError):
            continue
        if name.endswith("(nats-server") and int(rest.split()[1]) == parent:
            found[f"nats-server-{len(found)}"] = int(entry.name)
    return found


def cpu_seconds(pids: dict[str, int | None]) -> dict[str, float]:
    """CPU time (user + system) used so far by each process, from /proc (Linux)."""
    used: dict[str, float] = {}
    for name, pid in pids.items():
        found = process_stat(pid) if pid is not None else None
        if found is not None:
            used[name] = found[1]
    return used


async def measure_admission(
    cluster: EmbeddedCluster,
    connection: nats.NATS,
    publisher: EventPublisher,
    timeline: Timeline,
    gpus: int,
    rate: float,
    seconds: float,
    time_limit: float,
) -> None:
    fillers = [f"filler-{n}" for n in range(gpus)]
    for job_id in fillers:
        await publisher.publish(
            JobSubmitted(user=USER, job_id=job_id, gpus=1, command=tuple(LONG_JOB))
        )
    for job_id in fillers:
        await timeline.wait(job_id, {"started"}, 60)
    count = int(rate * seconds)
    pids = {name: child.pid for name, child in cluster.children.items()}
    pids.update(brokers_of(os.getpid()))
    cpu_before = cpu_seconds(pids)
    sent: list[str] = []
    in_flight: set[asyncio.Task[PubAck]] = set()
    began = time.monotonic()
    for n in range(count):
        due = began + n / rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        while len(in_flight) >= MAX_IN_FLIGHT:
            await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        job_id = f"burst-{n}"
        task = publisher.send(
            JobSubmitted(user=USER, job_id=job_id, gpus=1, command=tuple(LONG_JOB))
        )
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        sent.append(job_id)
        if time.monotonic() - began > time_limit:
            break
    offer_s = time.monotonic() - began
    stored = await asyncio.gather(*in_flight, return_exceptions=True)
    failed = sum(1 for result in stored if isinstance(result, BaseException))
    publish_s = time.monotonic() - began
    drain_until = time.monotonic() + 60
    answered: list[str] = []
    for job_id in sent:
        if await timeline.wait(
            job_id, {"accepted", "rejected"}, max(drain_until - time.monotonic(), 0)
        ):
            answered.append(job_id)
    answer_times = [
        timeline.seen[j].get("accepted") or timeline.seen[j]["rejected"] for j in answered
    ]
    first_sent = min(timeline.seen[j]["submitted"] for j in sent if "submitted" in timeline.seen[j])
    span_s = (max(answer_times) - first_sent).total_seconds() if answer_times else 0.0
    lag = [v for j in answered if (v := timeline.span_ms(j, "submitted", "accepted")) is not None]
    print(
        f"  offered {len(sent)} submissions in {offer_s:.2f} s ({len(sent) / offer_s:.0f}/s), "
        f"all stored after {publish_s:.2f} s" + (f", {failed} publishes failed" if failed else "")
    )
    print(
        f"  answered {len(answered)} ({len(answered) / span_s:.0f}/s over {span_s:.2f} s), "
        f"lost {len(sent) - len(answered)}"
    )
    print(f"  submitted -> accepted             {percentiles(lag)}")
    # Until every service has taken in every submission: all the work they cost.
    settled_s = await settle(connection)
    cpu_after = cpu_seconds(pids)
    used = {n: cpu_after[n] - cpu_before.get(n, 0.0) for n in cpu_after}
    busiest = sorted(used, key=lambda n: -used[n])[:7]
    total = sum(used.values())
    print(
        f"  CPU seconds until every consumer drained ({settled_s:.1f} s after the last answer): "
        f"{total:.1f} in all, {total / max(len(sent), 1) * 1000:.1f} ms per submission; "
        + ", ".join(f"{n} {used[n]:.1f}" for n in busiest)
    )
    for job_id in [*fillers, *sent]:
        await publisher.publish(JobCancelRequested(user=USER, job_id=job_id))


async def main_async(args: argparse.Namespace) -> None:
    configure_logging("bench", level="WARNING", fmt="console")
    with tempfile.TemporaryDirectory(prefix="gfair-bench-live-") as data_dir:
        options = ClusterOptions(
            cluster=args.cluster,
            quantum_s=DEFAULT_QUANTUM_S,
            data_dir=Path(data_dir),
            log_level="WARNING",
        )
        async with EmbeddedCluster(options) as cluster:
            url = cluster.nats_url
            gpus = cluster.servers.total_gpus
            print(f"cluster {args.cluster} ({gpus} simulated GPUs) on {url}\n")
            print("bus baseline, 1 publisher, 500 events (publish -> handle):")
            for run in (
                bench_raw_jetstream(url, 500, 1, 30),
                bench_runtime(url, 500, 1, 30, traced=False),
            ):
                result = await run
                print(f"  {result.path:<34} {percentiles(result.latencies_ms)}")
            connection = await nats.connect(url)
            settled_s = await settle(connection)
            print(f"  (the cluster settled {settled_s:.1f} s after the baseline)")
            timeline = Timeline()
            await connection.subscribe(f"gfair.submit.{USER}", cb=timeline.on_message)
            await connection.subscribe(f"gfair.job.{USER}.>", cb=timeline.on_message)
            await connection.subscribe("gfair.cmd.*.start", cb=timeline.on_message)
            bus = await NatsBus.connect(NatsOptions(servers=(url,), name="bench-live"))
            publisher = EventPublisher(bus, "bench-live")
            try:
                print("\nsubmit -> running, GPUs free, one job at a time:")
                await measure_latency(publisher, timeline, args.latency_jobs, args.time_limit / 3)
                print(
                    f"\nsustained submissions at {args.rate:g}/s for {args.seconds:g} s, GPUs busy:"
                )
                await measure_admission(
                    cluster,
                    connection,
                    publisher,
                    timeline,
                    gpus,
                    args.rate,
                    args.seconds,
                    args.time_limit / 3,
                )
            finally:
                await bus.close()
                await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="v100:2x8", help="servers, e.g. v100:2x8")
    parser.add_argument("--latency-jobs", type=int, default=40)
    parser.add_argument("--rate", type=float, default=200.0, help="submissions per second")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long to submit")
    parser.add_argument("--time-limit", type=float, default=240.0)
    args = parser.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
