"""The live control plane on clusters of virtual nodes, two sizes side by side.

Run: ``.venv/bin/python -m bench.scale [--servers 100 1000] [--jobs-per-gpu 2.5] [--quantum 60]
[--quanta 3] [--warmup 1] [--heartbeat 5] [--progress S] [--max-payload 64] [--logs DIR]
[--per-process 100]``;
for a quick look: ``--servers 5 20 --quantum 10 --quanta 2``. ``--logs`` keeps each cluster's
logs (`<DIR>/<servers>/`).

For each size, a whole cluster as `gfair up --virtual` starts it (embedded nats-server, the
five scheduler services, the query service, and processes running an executor per server
(``--per-process`` servers each, 100 by default, `GFAIR_VIRTUAL_NODES_PER_PROCESS`),
servers of four generations: 8 x V100, P100, K80 and A100 each in turn, jobs virtual),
``--jobs-per-gpu`` long synthetic jobs per GPU (2.5: 20,000 jobs on 1,000 servers, 2,000 on
100) from 100 users (mostly one GPU, some gangs of 2 and 4), so that every quantum
time-slices: it suspends some jobs and starts others. Executors heartbeat every
``--heartbeat`` seconds (the executor's default, 5) and every job reports its progress every
``--progress`` seconds (default: the executor's, a sixth of the quantum from 1 to 10 s: 10 s at
60 s quanta; it was 1 s until 2026-11-29). The broker takes messages of up to
``--max-payload`` MiB (split-stride stored its whole state as one message, which outgrew
nats-server's default 1 MiB from about 2,000 jobs on; it now stores a key per job, and the
default 64 keeps runs comparable with the earlier ones). Once every job is admitted and
``--warmup`` quanta have passed, for ``--quanta`` quanta it measures:

- per quantum, the time from the tick (`QuantumTicked`) to the last command of that quantum
  applied by its node (the node's `JobStarted`/`JobResumed`/`JobSuspended`/`JobMigrated`
  caused by the command); of it, the time to the last command sent (split-stride sends a
  start only once the suspends it waits for are reported) and the decision itself (the
  kernel's quantum, split-stride's ``gfair.quantum.decision.duration``);
- events per second through the broker (everything stored in the streams, heartbeats,
  telemetry and progress included);
- each process's CPU seconds per quantum, its memory (RSS) at the end and at its peak.

Then it SIGKILLs the split-stride service (the cluster restarts it, as it restarts any child
that dies) and measures the time to it serving again (its state loaded, its consumers pulled
from) and to its first decision (the first `QuantumTicked` after the kill), beside when that
tick was due: a restarted split-stride keeps the grid of the quantum it took over. Then it cancels
every job and replays the `GFAIR_JOBS` history (`gfair.client.job_history`): jobs lost (no
end), ended twice, run on two servers at once, and GPUs held by two jobs at once. Throughout,
it counts the failure detector's suspicions and failures of nodes: none is real, since no
node stops.

Everything shares this machine's cores, the benchmark's own event counting too: the numbers
are what one box does, not what a cluster of machines does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import nats
from nats.aio.msg import Msg

from bench.live import brokers_of, cpu_seconds
from gfair.bus.logs import configure_logging
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.publisher import EventPublisher
from gfair.client.job_history import (
    REPLAYED,
    Outcomes,
    gpu_overlaps,
    job_history,
    most_nodes_at_once,
)
from gfair.core.kernel import DEFAULT_QUANTUM_S
from gfair.embedded_cluster import ClusterError, ClusterOptions, EmbeddedCluster
from gfair.events.commands import MigrateCommand, ResumeCommand, StartCommand, SuspendCommand
from gfair.events.jobs import (
    JobAccepted,
    JobCancelled,
    JobMigrated,
    JobResumed,
    JobStarted,
    JobSuspended,
)
from gfair.events.nodes import NodeFailed, NodeSuspected
from gfair.events.scheduling import QuantumTicked
from gfair.events.subjects import STREAMS
from gfair.events.submission import JobCancelRequested, JobSubmitted
from gfair_services.node_executor.settings import (
    DEFAULT_VIRTUAL_NODES_PER_PROCESS,
    progress_interval_for,
)

USERS = 100
GENERATIONS = ("v100", "p100", "k80", "a100")
JOB_TYPES = ("ResNet-50 (batch size 32)", "Transformer (batch size 64)", "LM (batch size 20)")
COMMANDS = {c.EVENT_TYPE for c in (StartCommand, ResumeCommand, SuspendCommand, MigrateCommand)}
SUSPENDED = SuspendCommand.EVENT_TYPE
APPLIED = (JobStarted, JobResumed, JobSuspended, JobMigrated)
_APPLIED_TYPES = {e.EVENT_TYPE for e in APPLIED}
SPLIT_STRIDE = "split_stride"
# Submissions and cancellations in flight at once: enough to keep the broker busy.
IN_FLIGHT = 256


@dataclass
class Recorder:
    """What the benchmark watches, as a core subscriber sees it: ticks, commands, what the
    nodes applied, admissions and cancellations, and the failure detector's verdicts."""

    ticks: list[datetime] = field(default_factory=list)
    commands: dict[str, datetime] = field(default_factory=dict)  # command id -> time
    applied: dict[str, datetime] = field(default_factory=dict)  # command id -> applied at
    kinds: dict[str, str] = field(default_factory=dict)  # command id -> its event type
    # command id -> how long the job took to carry it out, by its node's report (a suspend:
    # from the command to its GPUs free, the job finishing its mini-batch and checkpointing)
    job_s: dict[str, float] = field(default_factory=dict)
    accepted: set[str] = field(default_factory=set)
    cancelled: set[str] = field(default_factory=set)
    suspected: list[str] = field(default_factory=list)  # "<node> suspected|failed"
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def subjects(self) -> list[str]:
        kinds = (QuantumTicked, JobAccepted, JobCancelled, NodeSuspected, NodeFailed, *APPLIED)
        return ["gfair.cmd.>", *(kind.subject_pattern() for kind in kinds)]

    async def on_message(self, msg: Msg) -> None:
        try:
            envelope = json.loads(msg.data)
            kind = envelope["type"]
            at = datetime.fromisoformat(envelope["time"])
        except (ValueError, KeyError, TypeError):
            return
        data = envelope.get("data") or {}
        if kind == QuantumTicked.EVENT_TYPE:
            self.ticks.append(at)
        elif kind in COMMANDS:
            self.commands[envelope["id"]] = at
            self.kinds[envelope["id"]] = kind
        elif kind == JobAccepted.EVENT_TYPE:
            self.accepted.add(data.get("job_id", ""))
        elif kind == JobCancelled.EVENT_TYPE:
            self.cancelled.add(data.get("job_id", ""))
        elif kind in (NodeSuspected.EVENT_TYPE, NodeFailed.EVENT_TYPE):
            verdict = "failed" if kind == NodeFailed.EVENT_TYPE else "suspected"
            self.suspected.append(f"{data.get('node_id')} {verdict}")
        elif kind in _APPLIED_TYPES and envelope.get("causation_id"):
            self.applied.setdefault(envelope["causation_id"], at)
            if isinstance(data.get("duration_s"), int | float):
                self.job_s.setdefault(envelope["causation_id"], float(data["duration_s"]))
        self.changed.set()

    async def until(self, check: Callable[[], object], timeout_s: float) -> bool:
        """Until `check()` holds (True), or `timeout_s` passed (False)."""
        deadline = time.monotonic() + timeout_s
        while not check():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 1.0))
        return True

    def ticks_after(self, since: datetime) -> list[datetime]:
        return [t for t in self.ticks if t > since]


@dataclass
class Result:
    servers: int
    gpus: int
    jobs: int
    tick_to_applied_s: list[float]
    tick_to_sent_s: list[float]
    # Each command of the measured quanta, from sent to applied by its node; the suspends
    # among them, and how long each job took to yield by its node's report.
    sent_to_applied_s: list[float]
    suspend_s: list[float]
    yield_s: list[float]
    decision_s: list[float]
    commands_per_quantum: list[int]
    unapplied: int
    events_per_s: float
    cpu_s: dict[str, float]
    rss_mib: dict[str, float]
    peak_mib: dict[str, float]
    suspicions: list[str]
    restart_serving_s: float | None
    restart_decision_s: float | None
    restart_due_s: float | None
    lost: int
    ended_twice: int
    run_twice: int
    overlaps: int
    gpu_intervals: int
    timings_s: dict[str, float]
    notes: list[str]


def _memory_mib(pid: int | None, key: str) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cluster_spec(servers: int) -> str:
    """`servers` servers of 8 GPUs, the generations in equal parts (the first ones get the
    remainder)."""
    parts = []
    for index, generation in enumerate(GENERATIONS):
        count = servers // len(GENERATIONS) + (1 if index < servers % len(GENERATIONS) else 0)
        if count:
            parts.append(f"{generation}:{count}x8")
    return ",".join(parts)


async def _stored_events(bus: NatsBus) -> int:
    """Events stored in the streams so far (each stream's last sequence)."""
    js = bus.client.jetstream()
    total = 0
    for stream in STREAMS:
        info = await js.stream_info(stream.name)
        total += info.state.last_seq
    return total


def _decisions(metrics_file: Path) -> list[tuple[datetime, float]]:
    """Each quantum decision split-stride recorded (when exported, seconds), from the
    cumulative ``gfair.quantum.decision.duration`` histogram in the metrics file: a count
    that grew by one between two exports is one decision, the sum's growth its time."""
    found: list[tuple[datetime, float]] = []
    count, total = 0, 0.0
    try:
        lines = metrics_file.read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        if '"gfair.quantum.decision.duration"' not in line:
            continue
        record = json.loads(line)
        if record["count"] < count:  # a new incarnation counts from zero
            count, total = 0, 0.0
        if record["count"] > count:
            at = datetime.fromtimestamp(record["time_ns"] / 1e9, UTC)
            share = (record["sum"] - total) / (record["count"] - count)
            found += [(at, share)] * (record["count"] - count)
        count, total = record["count"], record["sum"]
    return found


async def _publish_all(publisher: EventPublisher, events: Sequence[JobSubmitted]) -> None:
    """Publish `events` with `IN_FLIGHT` of them awaiting their acknowledgement at once."""
    for begin in range(0, len(events), IN_FLIGHT):
        await asyncio.gather(*(publisher.publish(e) for e in events[begin : begin + IN_FLIGHT]))


async def _cancel_all(publisher: EventPublisher, jobs: Sequence[JobSubmitted]) -> None:
    for begin in range(0, len(jobs), IN_FLIGHT):
        await asyncio.gather(
            *(
                publisher.publish(JobCancelRequested(user=job.user, job_id=job.job_id))
                for job in jobs[begin : begin + IN_FLIGHT]
            )
        )


def _jobs(count: int) -> list[JobSubmitted]:
    sizes = [1] * 8 + [2, 4]
    jobs = []
    for n in range(count):
        job_type = JOB_TYPES[n % len(JOB_TYPES)]
        command = (sys.executable, "-m", "gfair.sdk.synthetic", "--job-type", job_type,
                   "--duration-s", "1000000")  # fmt: skip
        jobs.append(
            JobSubmitted(
                user=f"u{n % USERS}",
                job_id=f"j{n}",
                gpus=sizes[n % len(sizes)],
                command=command,
                job_type=job_type,
            )
        )
    return jobs


@dataclass(frozen=True)
class Plan:
    jobs_per_gpu: float
    quantum_s: float
    quanta: int
    warmup: int
    heartbeat_s: float
    progress_s: float  # the executor's progress interval
    max_payload_mib: int
    # How long admitting every job, and cancelling every job, may take.
    stage_timeout_s: float
    # Where to keep each size's cluster logs (`<dir>/<servers>/`), if anywhere.
    logs: Path | None = None
    # Servers per virtual-nodes process.
    per_process: int = DEFAULT_VIRTUAL_NODES_PER_PROCESS


async def measure(servers: int, plan: Plan) -> Result:
    gpus = servers * 8
    jobs = _jobs(int(gpus * plan.jobs_per_gpu))
    timings: dict[str, float] = {}
    notes: list[str] = []
    began = time.monotonic()
    quantum_s = plan.quantum_s
    with tempfile.TemporaryDirectory(prefix="gfair-scale-") as tmp:
        os.chmod(tmp, 0o711)  # an executor running as root wants its roots open to passage
        options = ClusterOptions(
            cluster=cluster_spec(servers),
            quantum_s=quantum_s,
            data_dir=Path(tmp) / "gfair",
            virtual=True,
            virtual_per_process=plan.per_process,
            log_level="WARNING",
            ready_timeout_s=600.0,
            heartbeat_s=plan.heartbeat_s,
            env={"GFAIR_PROGRESS_INTERVAL_S": f"{plan.progress_s:g}"},
            max_payload=plan.max_payload_mib * 1024 * 1024,
        )
        async with EmbeddedCluster(options) as cluster:
            timings["start"] = time.monotonic() - began
            connection = await nats.connect(cluster.nats_url)
            recorder = Recorder()
            for subject in recorder.subjects():
                await connection.subscribe(subject, cb=recorder.on_message)
            bus = await NatsBus.connect(NatsOptions(servers=(cluster.nats_url,)))
            publisher = EventPublisher(bus, "bench-scale")
            mark = time.monotonic()
            await _publish_all(publisher, jobs)
            timings["submit"] = time.monotonic() - mark
            mark = time.monotonic()
            if not await recorder.until(
                lambda: len(recorder.accepted) >= len(jobs), plan.stage_timeout_s
            ):
                notes.append(
                    f"admitted {len(recorder.accepted):,} of {len(jobs):,} jobs within "
                    f"{plan.stage_timeout_s:g} s; measured as it was"
                )
            timings["admit"] = time.monotonic() - mark
            first = len(recorder.ticks) + plan.warmup
            longest = quantum_s * 2 + 60
            await recorder.until(lambda: len(recorder.ticks) > first, (plan.warmup + 1) * longest)
            pids = {name: child.pid for name, child in cluster.children.items()}
            pids.update(brokers_of(os.getpid()))
            cpu_before, events_before = cpu_seconds(pids), await _stored_events(bus)
            mark = time.monotonic()
            # One tick past the last measured quantum closes it.
            last = first + plan.quanta
            if not await recorder.until(lambda: len(recorder.ticks) > last, plan.quanta * longest):
                notes.append(f"ticks: {len(recorder.ticks) - first} of {plan.quanta + 1} came")
            await asyncio.sleep(min(quantum_s / 2, 10.0))  # the last quantum's commands applied
            elapsed = time.monotonic() - mark
            cpu_after = cpu_seconds(pids)
            events = await _stored_events(bus) - events_before
            rss = {name: _memory_mib(pid, "VmRSS") for name, pid in pids.items()}
            peak = {name: _memory_mib(pid, "VmHWM") for name, pid in pids.items()}
            serving_s, decision_s, due_s = await _restart(cluster, recorder, quantum_s)
            mark = time.monotonic()
            await _cancel_all(publisher, jobs)
            if not await recorder.until(
                lambda: len(recorder.cancelled) >= len(jobs), plan.stage_timeout_s
            ):
                notes.append(
                    f"cancelled {len(recorder.cancelled):,} of {len(jobs):,} jobs within "
                    f"{plan.stage_timeout_s:g} s: the others count as without an end"
                )
            timings["cancel"] = time.monotonic() - mark
            mark = time.monotonic()
            history = await job_history(bus, only=REPLAYED)
            timings["replay"] = time.monotonic() - mark
            decisions = _decisions(cluster.span_file.with_name("metrics.jsonl"))
            await bus.close()
            await connection.close()
        if plan.logs is not None:
            shutil.copytree(Path(tmp) / "gfair" / "logs", plan.logs / str(servers))
    outcomes = Outcomes.of(history)
    expected = {(job.user, job.job_id) for job in jobs}
    ends = [len(outcomes.terminal.get(job, [])) for job in expected]
    overlaps, intervals = gpu_overlaps(history)
    ticks = recorder.ticks
    latencies: list[float] = []
    sending: list[float] = []
    applying: list[float] = []
    suspending: list[float] = []
    yielding: list[float] = []
    deciding: list[float] = []
    per_quantum: list[int] = []
    unapplied = 0
    for k in range(first, min(last, len(ticks) - 1)):
        begin, end = ticks[k], ticks[k + 1]
        sent = [c for c, at in recorder.commands.items() if begin <= at < end]
        done = [recorder.applied[c] for c in sent if c in recorder.applied]
        unapplied += len(sent) - len(done)
        per_quantum.append(len(sent))
        if sent:
            sending.append((max(recorder.commands[c] for c in sent) - begin).total_seconds())
        if done:
            latencies.append((max(done) - begin).total_seconds())
        applying += [
            (recorder.applied[c] - recorder.commands[c]).total_seconds()
            for c in sent
            if c in recorder.applied
        ]
        suspends = [c for c in sent if c in recorder.applied and recorder.kinds[c] == SUSPENDED]
        suspending += [
            (recorder.applied[c] - recorder.commands[c]).total_seconds() for c in suspends
        ]
        yielding += [recorder.job_s[c] for c in suspends if c in recorder.job_s]
        # The export after the tick and before the next holds this quantum's decision.
        deciding += [seconds for at, seconds in decisions if begin <= at < end][:1]
    timings["total"] = time.monotonic() - began
    return Result(
        servers=servers,
        gpus=gpus,
        jobs=len(jobs),
        tick_to_applied_s=latencies,
        tick_to_sent_s=sending,
        sent_to_applied_s=applying,
        suspend_s=suspending,
        yield_s=yielding,
        decision_s=deciding,
        commands_per_quantum=per_quantum,
        unapplied=unapplied,
        events_per_s=events / elapsed,
        cpu_s={name: cpu_after.get(name, 0.0) - cpu_before.get(name, 0.0) for name in cpu_after},
        rss_mib=rss,
        peak_mib=peak,
        suspicions=recorder.suspected,
        restart_serving_s=serving_s,
        restart_decision_s=decision_s,
        restart_due_s=due_s,
        lost=sum(1 for n in ends if n == 0),
        ended_twice=sum(1 for n in ends if n > 1),
        run_twice=sum(1 for n in most_nodes_at_once(history).values() if n > 1),
        overlaps=len(overlaps),
        gpu_intervals=intervals,
        timings_s=timings,
        notes=notes,
    )


async def _restart(
    cluster: EmbeddedCluster, recorder: Recorder, quantum_s: float
) -> tuple[float | None, float | None, float | None]:
    """SIGKILL split-stride: seconds from the kill to it serving again, to its first decision
    (the first tick after the kill), and to when that tick was due (a quantum after the last
    one before the kill); None for what did not come."""
    killed_at = datetime.now(UTC)
    due = ((recorder.ticks[-1] - killed_at).total_seconds() + quantum_s) if recorder.ticks else None
    cluster.children.kill(SPLIT_STRIDE)
    serving: float | None = None
    try:
        serving = await cluster.wait_serving(SPLIT_STRIDE, killed_at, timeout_s=300.0)
    except ClusterError as error:  # reported as not served: the run goes on to its checks
        print(f"split-stride did not serve again: {error}", file=sys.stderr)
    if not await recorder.until(lambda: recorder.ticks_after(killed_at), quantum_s * 2 + 300):
        return serving, None, due
    return serving, (recorder.ticks_after(killed_at)[0] - killed_at).total_seconds(), due


def _row(label: str, values: list[str]) -> str:
    return f"| {label} | " + " | ".join(values) + " |"


def _ms(values: list[float], how: str) -> str:
    if not values:
        return "-"
    value = statistics.median(values) if how == "median" else max(values)
    return f"{value * 1000:,.0f} ms"


def _quantile_ms(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:,.0f} ms"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def report(results: list[Result], plan: Plan, out: TextIO = sys.stdout) -> None:
    heads = [f"{r.servers:,} servers ({r.gpus:,} GPUs, {r.jobs:,} jobs)" for r in results]
    quanta = plan.quanta
    print(_row("", heads), file=out)
    print("|---|" + "---|" * len(results), file=out)
    rows: list[tuple[str, list[str]]] = [
        (f"tick to last command applied, median of {quanta} quanta",
         [_ms(r.tick_to_applied_s, "median") for r in results]),
        ("tick to last command applied, worst quantum",
         [_ms(r.tick_to_applied_s, "max") for r in results]),
        ("of which tick to last command sent, median",
         [_ms(r.tick_to_sent_s, "median") for r in results]),
        ("a command, sent to applied by its node: median / p99",
         [f"{_quantile_ms(r.sent_to_applied_s, 0.5)} / {_quantile_ms(r.sent_to_applied_s, 0.99)}"
          for r in results]),
        ("a suspend, sent to applied: median / p99",
         [f"{_quantile_ms(r.suspend_s, 0.5)} / {_quantile_ms(r.suspend_s, 0.99)}"
          for r in results]),
        ("of which the job yielding (its node's report): median / p99",
         [f"{_quantile_ms(r.yield_s, 0.5)} / {_quantile_ms(r.yield_s, 0.99)}" for r in results]),
        ("of which the decision (kernel), median",
         [_ms(r.decision_s, "median") for r in results]),
        ("commands per quantum (mean)",
         [f"{statistics.mean(r.commands_per_quantum or [0]):,.0f}" for r in results]),
        ("commands not applied by the end",
         [f"{r.unapplied:,}" for r in results]),
        ("events per second (stored by the broker)",
         [f"{r.events_per_s:,.0f}" for r in results]),
        ("false suspicions / failures of nodes (whole run)",
         [f"{sum('suspected' in s for s in r.suspicions)} / "
          f"{sum('failed' in s for s in r.suspicions)}" for r in results]),
        ("split-stride killed: serving again / first decision (its tick due at)",
         [f"{_s(r.restart_serving_s)} / {_s(r.restart_decision_s)} ({_s(r.restart_due_s)})"
          for r in results]),
        ("jobs lost / ended twice / run on two servers at once",
         [f"{r.lost} / {r.ended_twice} / {r.run_twice}" for r in results]),
        ("GPUs held by two jobs at once (of GPU intervals replayed)",
         [f"{r.overlaps} (of {r.gpu_intervals:,})" for r in results]),
    ]  # fmt: skip
    for label, values in rows:
        print(_row(label, values), file=out)
    names: dict[str, None] = {}
    for r in results:
        names.update(dict.fromkeys(r.cpu_s))
    for name in names:
        print(_row(f"{name}: CPU s per quantum / RSS / peak RSS MiB", [
            f"{r.cpu_s.get(name, 0.0) / quanta:.1f} / {r.rss_mib.get(name, 0.0):,.0f} / "
            f"{r.peak_mib.get(name, 0.0):,.0f}"
            for r in results
        ]), file=out)  # fmt: skip
    print(_row("seconds: start / submit / admit / cancel / replay / whole run", [
        " / ".join(f"{r.timings_s.get(k, 0.0):.0f}"
                   for k in ("start", "submit", "admit", "cancel", "replay", "total"))
        for r in results
    ]), file=out)  # fmt: skip
    for r in results:
        for note in r.notes:
            print(f"\n{r.servers} servers: {note}", file=out)
        if r.suspicions:
            shown = ", ".join(r.suspicions[:10])
            print(f"\n{r.servers} servers, the failure detector's verdicts: {shown}", file=out)


async def main_async(args: argparse.Namespace) -> None:
    configure_logging("bench-scale", level="WARNING", fmt="console")
    plan = Plan(
        jobs_per_gpu=args.jobs_per_gpu,
        quantum_s=args.quantum,
        quanta=args.quanta,
        warmup=args.warmup,
        heartbeat_s=args.heartbeat,
        progress_s=args.progress or progress_interval_for(args.quantum),
        max_payload_mib=args.max_payload,
        stage_timeout_s=args.stage_timeout,
        logs=args.logs,
        per_process=args.per_process,
    )
    results = []
    failed: list[str] = []
    for servers in args.servers:
        print(f"... {servers} virtual servers", file=sys.stderr, flush=True)
        try:
            results.append(await measure(servers, plan))
        except ClusterError as error:  # the other sizes are still worth their report
            failed.append(f"{servers} servers: the cluster did not start: {error}".split("\n")[0])
            continue
        report(results[-1:], plan, out=sys.stderr)  # kept, should a later size not finish
    print(
        f"\nquantum {plan.quantum_s:g} s, {plan.quanta} quanta measured after {plan.warmup}; "
        f"heartbeats every {plan.heartbeat_s:g} s, progress every {plan.progress_s:g} s, "
        f"{plan.per_process} servers per virtual-nodes process, "
        f"broker's max payload {plan.max_payload_mib} MiB"
    )
    report(results, plan)
    for line in failed:
        print(f"\n{line}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--servers", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--jobs-per-gpu", type=float, default=2.5)
    parser.add_argument("--quantum", type=float, default=DEFAULT_QUANTUM_S)
    parser.add_argument("--quanta", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--heartbeat", type=float, default=5.0)
    parser.add_argument(
        "--progress", type=float, default=None, help="default: the executor's for the quantum"
    )
    parser.add_argument("--max-payload", type=int, default=64, help="the broker's, MiB")
    parser.add_argument(
        "--logs", type=Path, help="keep each size's cluster logs here, in <servers>/"
    )
    parser.add_argument(
        "--stage-timeout", type=float, default=300.0, help="admitting, cancelling: seconds"
    )
    parser.add_argument(
        "--per-process",
        type=int,
        default=DEFAULT_VIRTUAL_NODES_PER_PROCESS,
        help="servers per virtual-nodes process",
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
