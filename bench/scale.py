"""The live control plane on clusters of virtual nodes, two sizes side by side.

Run: ``.venv/bin/python -m bench.scale [--servers 10 100] [--jobs-per-gpu 2] [--quantum 5]
[--quanta 5] [--warmup 2]``

For each size, a whole cluster as `gfair up --virtual` starts it (embedded nats-server, the
five scheduler services, the query service, and one process running an executor per server,
half of them 8 x V100, half 8 x K80, jobs virtual), ``--jobs-per-gpu`` long synthetic jobs
per GPU from 20 users (mostly one GPU, some gangs of 2 and 4), so that every quantum
time-slices: it suspends some jobs and starts others. After ``--warmup`` quanta, for
``--quanta`` quanta, it measures:

- per quantum, the time from the tick (`QuantumTicked`) to the last command of that quantum
  applied by its node (the node's `JobStarted`/`JobResumed`/`JobSuspended`/`JobMigrated`
  caused by the command), of which the time to the last command sent (split-stride sends a
  start only once the suspends it waits for are reported), and how many commands the quantum
  sent (the commands between its tick and the next);
- events per second through the broker (everything on ``gfair.>``, heartbeats included);
- each process's CPU seconds over the measured quanta, and its memory (RSS) at the end.

Everything shares this machine's cores, the benchmark's own event counting too: the numbers
are what one box does, not what a cluster of machines does.
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
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import nats
from nats.aio.msg import Msg

from bench.live import brokers_of, cpu_seconds
from gfair.bus.logs import configure_logging
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.publisher import EventPublisher
from gfair.embedded_cluster import ClusterOptions, EmbeddedCluster
from gfair.events.commands import MigrateCommand, ResumeCommand, StartCommand, SuspendCommand
from gfair.events.jobs import JobMigrated, JobResumed, JobStarted, JobSuspended
from gfair.events.scheduling import QuantumTicked
from gfair.events.submission import JobSubmitted

USERS = 20
JOB_TYPES = ("ResNet-50 (batch size 32)", "Transformer (batch size 64)", "LM (batch size 20)")
COMMANDS = {c.EVENT_TYPE for c in (StartCommand, ResumeCommand, SuspendCommand, MigrateCommand)}
APPLIED = {e.EVENT_TYPE for e in (JobStarted, JobResumed, JobSuspended, JobMigrated)}


@dataclass
class Recorder:
    """Every event on the broker, as a core subscriber sees it: ticks, commands, applications."""

    events: int = 0
    ticks: list[datetime] = field(default_factory=list)
    commands: dict[str, datetime] = field(default_factory=dict)  # command id -> time
    applied: dict[str, datetime] = field(default_factory=dict)  # command id -> applied at
    new_tick: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_message(self, msg: Msg) -> None:
        self.events += 1
        try:
            envelope = json.loads(msg.data)
            kind = envelope["type"]
            at = datetime.fromisoformat(envelope["time"])
        except (ValueError, KeyError, TypeError):
            return
        if kind == QuantumTicked.EVENT_TYPE:
            self.ticks.append(at)
            self.new_tick.set()
        elif kind in COMMANDS:
            self.commands[envelope["id"]] = at
        elif kind in APPLIED and envelope.get("causation_id"):
            self.applied.setdefault(envelope["causation_id"], at)

    async def until_ticks(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.ticks) < count:
            self.new_tick.clear()
            await asyncio.wait_for(self.new_tick.wait(), max(0.1, deadline - time.monotonic()))


@dataclass
class Result:
    servers: int
    gpus: int
    jobs: int
    tick_to_applied_s: list[float]
    tick_to_sent_s: list[float]
    commands_per_quantum: list[int]
    unapplied: int
    events_per_s: float
    cpu_s: dict[str, float]
    rss_mib: dict[str, float]


def _rss_mib(pid: int | None) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _spec(servers: int) -> str:
    v100 = max(1, servers // 2)
    return f"v100:{v100}x8" + (f",k80:{servers - v100}x8" if servers > v100 else "")


async def measure(
    servers: int, jobs_per_gpu: float, quantum_s: float, quanta: int, warmup: int
) -> Result:
    gpus = servers * 8
    with tempfile.TemporaryDirectory(prefix="gfair-scale-") as tmp:
        os.chmod(tmp, 0o711)  # an executor running as root wants its roots open to passage
        options = ClusterOptions(
            cluster=_spec(servers),
            quantum_s=quantum_s,
            data_dir=Path(tmp) / "gfair",
            virtual=True,
            log_level="WARNING",
            ready_timeout_s=600.0,
            services=("failure_detector", "profiler", "trading_auction", "placement",
                      "split_stride", "query"),
        )  # fmt: skip
        async with EmbeddedCluster(options) as cluster:
            connection = await nats.connect(cluster.nats_url)
            recorder = Recorder()
            await connection.subscribe("gfair.>", cb=recorder.on_message)
            bus = await NatsBus.connect(NatsOptions(servers=(cluster.nats_url,)))
            publisher = EventPublisher(bus, "bench-scale")
            sizes = [1] * 8 + [2, 4]
            count = int(gpus * jobs_per_gpu)
            for n in range(count):
                job_type = JOB_TYPES[n % len(JOB_TYPES)]
                command = (sys.executable, "-m", "gfair.sdk.synthetic", "--job-type", job_type,
                           "--duration-s", "1000000")  # fmt: skip
                await publisher.publish(
                    JobSubmitted(
                        user=f"u{n % USERS}",
                        job_id=f"j{n}",
                        gpus=sizes[n % len(sizes)],
                        command=command,
                        job_type=job_type,
                    )
                )
            first = len(recorder.ticks) + warmup
            await recorder.until_ticks(first + 1, timeout_s=(warmup + 2) * quantum_s * 4 + 120)
            pids = {name: child.pid for name, child in cluster.children.items()}
            pids.update(brokers_of(os.getpid()))
            cpu_before, events_before, began = cpu_seconds(pids), recorder.events, time.monotonic()
            # One tick past the last measured quantum closes it.
            await recorder.until_ticks(first + quanta + 1, timeout_s=quanta * quantum_s * 4 + 120)
            await asyncio.sleep(quantum_s / 2)  # the last quantum's commands applied
            elapsed = time.monotonic() - began
            cpu_after = cpu_seconds(pids)
            events = recorder.events - events_before
            rss = {name: _rss_mib(pid) for name, pid in pids.items()}
            await bus.close()
            await connection.close()
    ticks = recorder.ticks
    latencies: list[float] = []
    sending: list[float] = []
    per_quantum: list[int] = []
    unapplied = 0
    for k in range(first, first + quanta):
        begin, end = ticks[k], ticks[k + 1]
        sent = [c for c, at in recorder.commands.items() if begin <= at < end]
        done = [recorder.applied[c] for c in sent if c in recorder.applied]
        unapplied += len(sent) - len(done)
        per_quantum.append(len(sent))
        if sent:
            sending.append((max(recorder.commands[c] for c in sent) - begin).total_seconds())
        if done:
            latencies.append((max(done) - begin).total_seconds())
    return Result(
        servers=servers,
        gpus=gpus,
        jobs=count,
        tick_to_applied_s=latencies,
        tick_to_sent_s=sending,
        commands_per_quantum=per_quantum,
        unapplied=unapplied,
        events_per_s=events / elapsed,
        cpu_s={name: cpu_after.get(name, 0.0) - cpu_before.get(name, 0.0) for name in cpu_after},
        rss_mib=rss,
    )


def _row(label: str, values: list[str]) -> str:
    return f"| {label} | " + " | ".join(values) + " |"


def report(results: list[Result], quanta: int) -> None:
    heads = [f"{r.servers} servers ({r.gpus} GPUs, {r.jobs} jobs)" for r in results]
    print(_row("", heads))
    print("|---|" + "---|" * len(results))

    def stat(values: list[float], q: str) -> str:
        if not values:
            return "-"
        if q == "p50":
            return f"{statistics.median(values) * 1000:.0f} ms"
        return f"{max(values) * 1000:.0f} ms"

    print(_row(f"tick to last command applied, median of {quanta} quanta",
               [stat(r.tick_to_applied_s, "p50") for r in results]))  # fmt: skip
    print(_row("tick to last command applied, worst quantum",
               [stat(r.tick_to_applied_s, "max") for r in results]))  # fmt: skip
    print(_row("of which tick to last command sent, median",
               [stat(r.tick_to_sent_s, "p50") for r in results]))  # fmt: skip
    means = [f"{statistics.mean(r.commands_per_quantum or [0]):.0f}" for r in results]
    print(_row("commands per quantum (mean)", means))
    print(_row("commands not applied half a quantum after the last",
               [str(r.unapplied) for r in results]))  # fmt: skip
    print(_row("events per second (broker)", [f"{r.events_per_s:.0f}" for r in results]))
    names: dict[str, None] = {}
    for r in results:
        names.update(dict.fromkeys(r.cpu_s))
    for name in names:
        print(_row(f"{name}: CPU s per quantum / RSS MiB", [
            f"{r.cpu_s.get(name, 0.0) / quanta:.2f} / {r.rss_mib.get(name, 0.0):.0f}"
            for r in results
        ]))  # fmt: skip


async def main_async(args: argparse.Namespace) -> None:
    configure_logging("bench-scale", level="WARNING", fmt="console")
    results = []
    for servers in args.servers:
        print(f"... {servers} virtual servers", file=sys.stderr, flush=True)
        results.append(
            await measure(servers, args.jobs_per_gpu, args.quantum, args.quanta, args.warmup)
        )
    print(f"\nquantum {args.quantum:g} s, {args.quanta} quanta measured after {args.warmup}")
    report(results, args.quanta)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--servers", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--jobs-per-gpu", type=float, default=2.0)
    parser.add_argument("--quantum", type=float, default=5.0)
    parser.add_argument("--quanta", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
