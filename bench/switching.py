"""What a time slice costs real training: restart per slice against suspension in place.

Run: ``.venv/bin/python -m bench.switching [--quanta 3,6] [--steps 16000]``

Needs torch (the CPU build will do). For each quantum it starts a cluster as `gfair up` does
(``v100:1x2``, simulated GPUs, tickets alice=1 bob=3) and runs ``examples/pytorch_train.py``
(alice's, one GPU) beside two of bob's synthetic jobs, twice: with ``--restart-per-slice``
(every yield checkpoints and exits, every slice a new process that imports torch and loads the
checkpoint: how gfair worked before suspension in place), as the example is (a time slice
parks the process in place; the next slice on the node continues it), and the same submitted
with ``prepare`` (its process starts before its first slice, without GPUs, imports torch and
parks in `Job.from_env()`; the first slice resumes it there: "in place, prepared"). Printed
side by side:

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
- in steps: the share of those GPU-seconds the job spent in its mini-batches, as its own step
  records time them: what switching costs, apart from the cluster's processes slowing every
  step on a box of few cores (which lowers the efficiency, not this).

Everything shares this machine's cores: the numbers are what one box does, not a cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.quanta import add_quanta_option
from gfair.bus.logs import configure_logging
from gfair.client import GfairClient
from gfair.client.switching import seconds_held
from gfair.embedded_cluster import ClusterOptions, EmbeddedCluster
from gfair.events.jobs import JobResumed, JobStarted, JobSuspended
from gfair.events.reasons import SuspendReason
from gfair.sdk.environment import ENV_CHECKPOINT_DIR, ENV_CONTROL_DIR, ENV_JOB_ID, PROGRESS_FILE

CLUSTER = "v100:1x2"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pytorch_train.py"
BOB = [sys.executable, "-m", "gfair.sdk.synthetic", "--duration-s", "1000000"]
TICKETS = {"alice": 1.0, "bob": 3.0}
RESTART, IN_PLACE, PREPARED = "restart per slice", "in place", "in place, prepared"
# --modes names them briefly.
MODES = {"restart": RESTART, "in-place": IN_PLACE, "prepared": PREPARED}


@dataclass(frozen=True, slots=True)
class Outcome:
    quantum_s: float
    mode: str
    suspends: int
    # Processes started while holding a GPU (a start, or a resume from a checkpoint): what a
    # prepared start saves the first of.
    processes: int
    yield_p50: float | None
    resume_p50: float | None
    held_s: float
    training_s: float
    stepping_s: float
    wall_s: float

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


def training_alone(steps: int) -> float:
    """First to last mini-batch of one uninterrupted run (its SDK writes the step records)."""
    with tempfile.TemporaryDirectory(prefix="gfair-alone-") as tmp:
        base = Path(tmp)
        env = {
            **os.environ,
            ENV_JOB_ID: "alone",
            ENV_CONTROL_DIR: str(base / "control"),
            ENV_CHECKPOINT_DIR: str(base / "checkpoints"),
        }
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), "--steps", str(steps)],
            env=env,
            check=False,
            capture_output=True,
        )
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace")[-2000:]
            raise RuntimeError(f"the training alone exited {done.returncode}:\n{tail}")
        span = _steps_span(base / "control" / PROGRESS_FILE)
        assert span is not None
        return span[1] - span[0]


def _stepping(data_dir: Path) -> float:
    """Seconds between consecutive step records of the job's runs, not across a park."""
    total = 0.0
    for progress in data_dir.glob("nodes/*/runs/alice/train/run-*/control/" + PROGRESS_FILE):
        last: float | None = None
        for line in progress.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if record.get("kind") == "step":
                if last is not None:
                    total += float(record["time"]) - last
                last = float(record["time"])
            elif record.get("kind") == "parked":
                last = None
    return total


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


async def run(quantum_s: float, mode: str, steps: int, training_s: float) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="gfair-switching-") as tmp:
        base = Path(tmp)
        os.chmod(tmp, 0o711)  # reachable by the tenants' own uids
        options = ClusterOptions(
            cluster=CLUSTER,
            quantum_s=quantum_s,
            data_dir=base / "gfair",
            user_tickets=TICKETS,
            log_level="WARNING",
        )
        async with EmbeddedCluster(options) as cluster:
            client = await GfairClient.connect(cluster.nats_url, poll_interval_s=0.1)
            async with client:
                for index in range(2):
                    await client.submit("bob", 1, BOB, job_id=f"b{index}")
                train = [sys.executable, str(EXAMPLE), "--steps", str(steps)]
                if mode == RESTART:
                    train.append("--restart-per-slice")
                began = time.monotonic()
                # Bob's jobs hold both GPUs: alice's waits for its first slice (prepared, it
                # waits with torch imported).
                await client.submit("alice", 1, train, job_id="train", prepare=mode == PREPARED)
                await client.wait("alice", "train", timeout_s=3600)
                wall = time.monotonic() - began
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
        return Outcome(
            quantum_s=quantum_s,
            mode=mode,
            suspends=len(suspends),
            processes=sum(
                isinstance(e, JobStarted) or (isinstance(e, JobResumed) and not e.in_place)
                for e in events
            ),
            yield_p50=statistics.median(yields) if yields else None,
            resume_p50=statistics.median(resumes) if resumes else None,
            held_s=seconds_held(details.events),
            training_s=training_s,
            stepping_s=_stepping(base / "gfair"),
            wall_s=wall,
        )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _print(outcomes: list[Outcome]) -> None:
    print(
        f"\n{'quantum':>7}  {'mode':<18} {'suspends':>8} {'processes':>9} {'yield p50 s':>11} "
        f"{'resume p50 s':>12} {'training s':>10} {'GPU-s held':>10} {'efficiency':>10} "
        f"{'in steps':>8} {'wall s':>7}"
    )
    for o in outcomes:
        print(
            f"{o.quantum_s:>6g}s  {o.mode:<18} {o.suspends:>8} {o.processes:>9} "
            f"{_seconds(o.yield_p50):>11} "
            f"{_seconds(o.resume_p50):>12} {o.training_s:>10.1f} {o.held_s:>10.1f} "
            f"{o.efficiency:>10.2f} {o.stepping_s / max(o.held_s, 1e-9):>8.2f} {o.wall_s:>7.1f}"
        )


async def _main(args: argparse.Namespace) -> int:
    outcomes = []
    for quantum in args.quanta:
        for mode in args.modes:
            training_s = training_alone(args.steps)
            outcome = await run(quantum, mode, args.steps, training_s)
            outcomes.append(outcome)
            print(
                f"quantum {quantum:g}s {outcome.mode}: training alone {training_s:.1f}s, "
                f"efficiency {outcome.efficiency:.2f}",
                flush=True,
            )
    _print(outcomes)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.switching", description=__doc__)
    parser.add_argument("--steps", type=int, default=16000, help="mini-batches of the job")
    add_quanta_option(parser)
    parser.add_argument(
        "--modes",
        type=lambda text: [MODES[m.strip()] for m in text.split(",")],
        default=list(MODES.values()),
        help=f"comma-separated, of: {', '.join(MODES)} (default: all)",
    )
    args = parser.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench.switching needs torch (pip install torch)", file=sys.stderr)
        return 2
    configure_logging("bench.switching", level="WARNING")
    return asyncio.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())
