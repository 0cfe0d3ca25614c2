"""What a time slice costs real training: restart per slice against suspension in place.

Run: ``.venv/bin/python -m bench.switching [--quanta 3,6] [--steps 16000] [--modes ...]
[--threads node,2] [--image gfair-example/pytorch:cpu]``

Needs torch (the CPU build will do). For each quantum it starts a cluster as `gfair up` does
(``v100:1x2``, simulated GPUs, or ``--cluster local``: this machine's own GPUs, where the job
trains on CUDA; tickets alice=1 bob=3) and runs ``examples/pytorch_train.py`` (alice's, one
GPU) beside one of bob's synthetic jobs per GPU, three times: with ``--restart-per-slice``
(every yield checkpoints and exits, every slice a new process that imports torch and loads the
checkpoint: how gfair worked before suspension in place), as the example is (a time slice
parks the process in place; the next slice on the node continues it), and the same submitted
with ``prepare`` (its process starts before its first slice, without GPUs, imports torch and
parks in `Job.from_env()`; the first slice resumes it there: "in place, prepared"); with
``--image``, also in place in its own container image through the node's Docker engine (the
example image, examples/images/pytorch: "in place, image"). Printed side by side:

- processes: how many times a process of it started holding a GPU (a start, or a resume from
  a checkpoint); a prepared start's first slice resumes the process that started without one;
- yield p50: from the suspend command to the GPUs being free (the node's `JobSuspended`);
- resume p50: from the start command to the first mini-batch after it; in place (and the
  first slice of a prepared start), the node's `JobResumed.duration_s`; restarted, the run's
  first step record less its process's start (the few milliseconds from the command to the
  process are left out: in its favour);
- efficiency: the training time alone (the same steps in one uninterrupted process, first to
  last mini-batch, measured just before each cluster run: the box's load drifts) over the
  GPU-seconds the job held (from each start to its release);
- start to step: from the node starting its first process (or creating its container) to its
  first mini-batch, the GPU-seconds held meanwhile: the imports, and a container's start;
- in steps: the share of those GPU-seconds the job spent in its mini-batches, as its own step
  records time them: what switching costs, apart from the cluster's processes slowing every
  step on a box of few cores (which lowers the efficiency, not this).

Then where the GPU-seconds held went, hold by hold (`bench.held_time`: to the first mini-batch,
stepping against the same mini-batches alone, to the park, to the node's report), and the CPU
time each of the cluster's processes used meanwhile, with the share of a core alice's job got
while it held its GPU (`bench.process_cpu`; a container's processes are the engine's children,
not this one's descendants, and are not counted). ``--threads`` runs alice's job, and its training
alone, with the node's thread share (``node``, `gfair.node.job_threads`) or a count of its own.

Everything shares this machine's cores: the numbers are what one box does, not a cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bench.held_time import HeldTime, Hold, held_time, holds, step_records
from bench.process_cpu import OTHER, ProcessCpu
from bench.quanta import add_quanta_option
from gfair.bus.logs import configure_logging
from gfair.client import GfairClient
from gfair.client.switching import seconds_held
from gfair.embedded_cluster import ClusterOptions, EmbeddedCluster
from gfair.events.jobs import JobResumed, JobStarted, JobSuspended
from gfair.events.reasons import SuspendReason
from gfair.node.job_threads import THREADS_VARIABLE, job_threads, threads_per_gpu
from gfair.sdk.environment import ENV_CHECKPOINT_DIR, ENV_CONTROL_DIR, ENV_JOB_ID, PROGRESS_FILE

CLUSTER = "v100:1x2"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pytorch_train.py"
BOB = [sys.executable, "-m", "gfair.sdk.synthetic", "--duration-s", "1000000"]
TICKETS = {"alice": 1.0, "bob": 3.0}
RESTART, IN_PLACE, PREPARED = "restart per slice", "in place", "in place, prepared"
IN_IMAGE = "in place, image"
# The example as its image holds it (examples/images/pytorch/Dockerfile).
EXAMPLE_IN_IMAGE = ["python", "/opt/example/pytorch_train.py"]
# The thread count the node gives alice's job (`gfair.node.job_threads`), or the job's own.
NODE_SHARE: Literal["node"] = "node"
Threads = int | Literal["node"]
ALICE = "alice's job"
# This process: the client polling for the job's end, and the CPU sampler.
BENCH = "bench"
# --modes names them briefly.
MODES = {"restart": RESTART, "in-place": IN_PLACE, "prepared": PREPARED}


@dataclass(frozen=True, slots=True)
class Outcome:
    quantum_s: float
    mode: str
    # OMP_NUM_THREADS of alice's job (and of its training alone).
    threads: int
    suspends: int
    # Processes started while holding a GPU (a start, or a resume from a checkpoint): what a
    # prepared start saves the first of.
    processes: int
    yield_p50: float | None
    resume_p50: float | None
    # From its first run's start (a process's spawn, a container's creation) to its first step.
    first_step_s: float | None
    held_s: float
    training_s: float
    # CPU seconds of the training alone's process (import to exit).
    alone_cpu_s: float
    wall_s: float
    # Where the held time went, hold by hold (bench.held_time).
    held: HeldTime
    # CPU seconds each role of the cluster's processes used from alice's submission to her
    # job's end.
    cpu: dict[str, float]

    @property
    def efficiency(self) -> float:
        return self.training_s / self.held_s if self.held_s > 0 else 0.0


def _steps_span(progress: Path) -> tuple[float, float] | None:
    """Times of the first and the last step record in a progress file."""
    times = []
    for line in progress.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if record.get("kind") == "step":
            times.append(float(record["time"]))
    return (times[0], times[-1]) if times else None


@dataclass(frozen=True, slots=True)
class Alone:
    """One uninterrupted run of the job: first to last mini-batch, and the CPU time its process
    used in all (import to exit, as the cluster's processes of it do)."""

    training_s: float
    cpu_s: float


def training_alone(steps: int, threads: int) -> Alone:
    """One uninterrupted run (its SDK writes the step records), with the threads its run in the
    cluster has."""
    with tempfile.TemporaryDirectory(prefix="gfair-alone-") as tmp:
        base = Path(tmp)
        env = {
            **os.environ,
            THREADS_VARIABLE: str(threads),
            ENV_JOB_ID: "alone",
            ENV_CONTROL_DIR: str(base / "control"),
            ENV_CHECKPOINT_DIR: str(base / "checkpoints"),
        }
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), "--steps", str(steps)],
            env=env,
            check=False,
            capture_output=True,
        )
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace")[-2000:]
            raise RuntimeError(f"the training alone exited {done.returncode}:\n{tail}")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime
        span = _steps_span(base / "control" / PROGRESS_FILE)
        assert span is not None
        return Alone(span[1] - span[0], cpu)


def _cold_resumes(data_dir: Path) -> list[float]:
    """Per restarted run (one resumed from a checkpoint): its process's start to its first step."""
    found = []
    for launch in sorted(data_dir.glob("nodes/*/runs/alice/train/run-*/launch.json")):
        record = json.loads(launch.read_text(encoding="utf-8"))
        progress = launch.parent / "control" / PROGRESS_FILE
        if record.get("resume_from") is None or not progress.exists():
            continue
        span = _steps_span(progress)
        if span is not None:
            found.append(span[0] - float(record["started_at"]))
    return found


def _first_step(data_dir: Path, held: list[Hold]) -> float | None:
    """The first run's start (its process or container made) to its first step, as far as it
    held its GPU meanwhile (a job parked while starting up waits for its next slice)."""
    launches = sorted(data_dir.glob("nodes/*/runs/alice/train/run-*/launch.json"))
    records = [(json.loads(p.read_text(encoding="utf-8")), p.parent) for p in launches]
    if not records:
        return None
    record, run_dir = min(records, key=lambda found: float(found[0]["started_at"]))
    span = _steps_span(run_dir / "control" / PROGRESS_FILE)
    if span is None:
        return None
    started = float(record["started_at"])
    overlaps = (min(h.ended, span[0]) - max(h.began, started) for h in held)
    return float(record.get("spawn_s", 0.0)) + sum(max(0.0, overlap) for overlap in overlaps)


def _server_gpus(cluster: str) -> int:
    return ClusterOptions(cluster=cluster).servers().servers[0].gpus


def _threads(threads: Threads, cluster: str) -> int:
    if threads != NODE_SHARE:
        return int(threads)
    return job_threads(threads_per_gpu(None, _server_gpus(cluster)), 1)


def _parse_threads(text: str) -> list[Threads]:
    found: list[Threads] = []
    for part in text.split(","):
        found.append(NODE_SHARE if part.strip() == NODE_SHARE else int(part))
    return found


def _own_cpu() -> float:
    own = os.times()
    return own.user + own.system


def role_of(argv: list[str]) -> str:
    """Which of the cluster's processes (or jobs) a command line is."""
    if argv and argv[0].endswith("nats-server"):
        return "nats-server"
    if any(part.endswith(EXAMPLE.name) for part in argv):
        return ALICE
    if "gfair.sdk.synthetic" in argv:
        return "bob's jobs"
    for part in argv:
        if part.startswith("gfair_services."):
            return part.removeprefix("gfair_services.").replace("_", "-")
    return OTHER


async def run(
    quantum_s: float,
    mode: str,
    steps: int,
    alone: Alone,
    threads: Threads,
    spec: str = CLUSTER,
    *,
    image: str | None = None,
) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="gfair-switching-") as tmp:
        base = Path(tmp)
        os.chmod(tmp, 0o711)  # reachable by the tenants' own uids
        options = ClusterOptions(
            cluster=spec,
            quantum_s=quantum_s,
            data_dir=base / "gfair",
            user_tickets=TICKETS,
            log_level="WARNING",
            env={"GFAIR_JOB_IMAGES": image} if mode == IN_IMAGE and image else {},
        )
        with ProcessCpu(role_of) as cpu:
            async with EmbeddedCluster(options) as cluster:
                client = await GfairClient.connect(cluster.nats_url, poll_interval_s=0.1)
                async with client:
                    # The measured table has no speeds for every real GPU's generation.
                    bob = [*BOB, "--steps-per-s", "10"] if options.local_gpus else BOB
                    for index in range(_server_gpus(spec)):
                        await client.submit("bob", 1, bob, job_id=f"b{index}")
                    program = (
                        EXAMPLE_IN_IMAGE if mode == IN_IMAGE else [sys.executable, str(EXAMPLE)]
                    )
                    train = [*program, "--steps", str(steps)]
                    if mode == RESTART:
                        train.append("--restart-per-slice")
                    began = time.monotonic()
                    before = cpu.used() | {BENCH: _own_cpu()}
                    # Bob's jobs hold every GPU: alice's waits for its first slice (prepared,
                    # it waits with torch imported).
                    await client.submit(
                        "alice",
                        1,
                        train,
                        job_id="train",
                        prepare=mode == PREPARED,
                        image=image if mode == IN_IMAGE else None,
                        # The job's own count, where it sets one, over the node's share.
                        env={} if threads == NODE_SHARE else {THREADS_VARIABLE: str(threads)},
                    )
                    await client.wait("alice", "train", timeout_s=3600)
                    wall = time.monotonic() - began
                    after = cpu.used() | {BENCH: _own_cpu()}
                    details = await client.job("alice", "train")
        events = [e.data for e in details.events]
        # A prepared start's park is not a yield: it held no GPU.
        suspends = [
            e
            for e in events
            if isinstance(e, JobSuspended) and e.reason is not SuspendReason.PREPARED
        ]
        yields = [s.duration_s for s in suspends if s.duration_s is not None]
        if mode != RESTART:
            resumes = [
                e.duration_s
                for e in events
                if isinstance(e, JobResumed) and e.in_place and e.duration_s is not None
            ]
        else:
            resumes = _cold_resumes(base / "gfair")
        alice_holds = holds(details.events, step_records(base / "gfair", "alice", "train"))
        return Outcome(
            quantum_s=quantum_s,
            mode=mode,
            threads=_threads(threads, spec),
            suspends=len(suspends),
            processes=sum(
                isinstance(e, JobStarted) or (isinstance(e, JobResumed) and not e.in_place)
                for e in events
            ),
            yield_p50=statistics.median(yields) if yields else None,
            resume_p50=statistics.median(resumes) if resumes else None,
            first_step_s=_first_step(base / "gfair", alice_holds),
            held_s=seconds_held(details.events),
            training_s=alone.training_s,
            alone_cpu_s=alone.cpu_s,
            wall_s=wall,
            held=held_time(alice_holds, alone.training_s / max(1, steps - 1)),
            cpu={role: after[role] - before.get(role, 0.0) for role in after},
        )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _print(outcomes: list[Outcome]) -> None:
    print(
        f"\n{'quantum':>7}  {'mode':<18} {'threads':>7} {'suspends':>8} {'processes':>9} "
        f"{'yield p50 s':>11} "
        f"{'resume p50 s':>12} {'start to step s':>15} {'training s':>10} {'GPU-s held':>10} "
        f"{'efficiency':>10} "
        f"{'in steps':>8} {'wall s':>7}"
    )
    for o in outcomes:
        print(
            f"{o.quantum_s:>6g}s  {o.mode:<18} {o.threads:>7} {o.suspends:>8} {o.processes:>9} "
            f"{_seconds(o.yield_p50):>11} "
            f"{_seconds(o.resume_p50):>12} {_seconds(o.first_step_s):>15} "
            f"{o.training_s:>10.1f} {o.held_s:>10.1f} {o.efficiency:>10.2f} "
            f"{o.held.stepping_s / max(o.held_s, 1e-9):>8.2f} "
            f"{o.wall_s:>7.1f}"
        )
    print(
        "\nWhere the GPU-seconds held went (sums over the holds, s; p50 per hold in brackets;"
        " late report: hold time before the resumes' reports less their duration):"
        f"\n{'quantum':>7}  {'mode':<18} {'threads':>7} {'holds':>5} {'held':>6} "
        f"{'to first step':>20} "
        f"{'stepping':>8} {'alone':>6} {'ratio':>5} {'to parked':>17} {'to report':>17} "
        f"{'other':>6} {'to resumed p50':>14} {'late report':>11}"
    )
    for o in outcomes:
        h = o.held
        # Stepping may begin before a late-reported resume's hold does: added back.
        parts = h.to_first_step_s + h.stepping_s + h.to_parked_s + h.to_report_s
        other = h.held_s + h.late_report_s - parts
        print(
            f"{o.quantum_s:>6g}s  {o.mode:<18} {o.threads:>7} {h.holds:>5} {h.held_s:>6.1f} "
            f"{_part(h.to_first_step_s, h.to_first_step_p50):>20} {h.stepping_s:>8.1f} "
            f"{h.alone_s:>6.1f} {h.step_ratio:>5.2f} {_part(h.to_parked_s, h.to_parked_p50):>17} "
            f"{_part(h.to_report_s, h.to_report_p50):>17} {other:>6.2f} "
            f"{_seconds(h.command_to_resumed_p50):>14} {h.late_report_s:>11.2f}"
        )
    roles = sorted({role for o in outcomes for role in o.cpu}, key=_role_order)
    print(
        "\nCPU seconds used from alice's submission to her job's end, by process (cores: all of"
        " them over the wall time; alone: the training alone's process; job/held: alice's job's"
        " CPU over the GPU-seconds it held, the share of a core it got):"
    )
    header = " ".join(f"{r:>13}" for r in roles)
    print(f"{'quantum':>7}  {'mode':<18} {'threads':>7} {header}  cores  alone  job/held")
    for o in outcomes:
        used = " ".join(f"{o.cpu.get(r, 0.0):>13.2f}" for r in roles)
        cores = sum(o.cpu.values()) / max(o.wall_s, 1e-9)
        share = o.cpu.get(ALICE, 0.0) / max(o.held_s, 1e-9)
        print(
            f"{o.quantum_s:>6g}s  {o.mode:<18} {o.threads:>7} {used}  {cores:>5.2f} "
            f"{o.alone_cpu_s:>6.2f}  {share:>8.2f}"
        )


def _part(total: float, median: float | None) -> str:
    return f"{total:.2f} ({_seconds(median)})"


def _role_order(role: str) -> tuple[int, str]:
    # The jobs first, then the node, then the rest.
    first = [ALICE, "bob's jobs", "node-executor", "nats-server"]
    return (first.index(role) if role in first else len(first), role)


async def _main(args: argparse.Namespace) -> int:
    outcomes = []
    for quantum in args.quanta:
        for threads in args.threads:
            for mode in args.modes:
                alone = training_alone(args.steps, _threads(threads, args.cluster))
                outcome = await run(
                    quantum, mode, args.steps, alone, threads, args.cluster, image=args.image
                )
                outcomes.append(outcome)
                print(
                    f"quantum {quantum:g}s {outcome.mode}, {outcome.threads} threads: training "
                    f"alone {alone.training_s:.1f}s, efficiency {outcome.efficiency:.2f}",
                    flush=True,
                )
    _print(outcomes)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.switching", description=__doc__)
    parser.add_argument("--steps", type=int, default=16000, help="mini-batches of the job")
    parser.add_argument(
        "--cluster",
        default=CLUSTER,
        help=f"the one server (default {CLUSTER}, simulated); 'local': this machine's GPUs (NVML), "
        "where the job trains on CUDA",
    )
    add_quanta_option(parser)
    parser.add_argument(
        "--modes",
        type=lambda text: [MODES[m.strip()] for m in text.split(",")],
        default=list(MODES.values()),
        help=f"comma-separated, of: {', '.join(MODES)} (default: all)",
    )
    parser.add_argument(
        "--threads",
        type=_parse_threads,
        default=[NODE_SHARE],
        help="comma-separated OMP_NUM_THREADS of alice's job: 'node' (what the node gives it, "
        "its share of the CPUs) or a number the job sets itself (the libraries' default is "
        f"the machine's CPUs, {os.cpu_count()} here); default: node",
    )
    parser.add_argument(
        "--image",
        help="also run the job in place in this image (examples/images/pytorch/build.sh "
        "builds gfair-example/pytorch:cpu), through this machine's Docker engine",
    )
    args = parser.parse_args(argv)
    if args.image and IN_IMAGE not in args.modes:
        args.modes.append(IN_IMAGE)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench.switching needs torch (pip install torch)", file=sys.stderr)
        return 2
    configure_logging("bench.switching", level="WARNING")
    return asyncio.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())
