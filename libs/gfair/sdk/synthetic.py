"""A synthetic training job: behaves like a real one to gfair, but only sleeps.

    python -m gfair.sdk.synthetic --job-type 'ResNet-50 (batch size 32)' --iterations 500

Without --iterations or --duration-s it trains for a minute's worth on a V100.

Each mini-batch takes 1 / (measured steps/s of the job type on $GFAIR_GPU_GENERATION with as
many GPUs as CUDA_VISIBLE_DEVICES lists) seconds, divided by --speed-scale so demos and tests
run fast. It resumes from its checkpoint, reports every mini-batch, checkpoints periodically and
when asked to yield. Failure injection reproduces what the failure policy must tell apart.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from gfair.sdk.job import Job
from gfair.sdk.throughput_table import ThroughputLookupError, ThroughputTable

DEFAULT_JOB_TYPE = "ResNet-50 (batch size 32)"
# What the generation defaults to outside gfair: the table's reference GPU.
REFERENCE_GENERATION = "v100"
# How long a job runs when told neither --iterations nor --duration-s: a minute on a V100.
DEFAULT_DURATION_S = 60.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gfair.sdk.synthetic", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--job-type", default=DEFAULT_JOB_TYPE, help="a Gavel job type")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--iterations", type=int, help="mini-batches to train in total")
    length.add_argument(
        "--duration-s",
        type=float,
        help="total length in seconds of training on one V100 gang "
        f"(default, without --iterations: {DEFAULT_DURATION_S:g})",
    )
    parser.add_argument(
        "--speed-scale", type=float, default=1.0, help="run this many times faster (demos)"
    )
    parser.add_argument("--generation", help="override $GFAIR_GPU_GENERATION")
    parser.add_argument("--num-gpus", type=int, help="override the count in CUDA_VISIBLE_DEVICES")
    parser.add_argument("--steps-per-s", type=float, help="override the table's rate")
    parser.add_argument("--throughputs", type=Path, help="path to gavel_throughputs.json")
    parser.add_argument(
        "--checkpoint-every", type=int, default=0, help="also checkpoint every N mini-batches"
    )
    parser.add_argument("--fail-at-step", type=int, help="exit with --exit-code at this step")
    parser.add_argument("--exit-code", type=int, default=1, help="exit code for --fail-at-step")
    parser.add_argument("--oom-at-step", type=int, help="die of CUDA out-of-memory at this step")
    parser.add_argument("--hang-at-step", type=int, help="stop making progress at this step")
    parser.add_argument(
        "--ignore-sigterm", action="store_true", help="ignore SIGTERM (only SIGKILL stops it)"
    )
    return parser


def visible_gpu_count(environ: Mapping[str, str]) -> int:
    devices = environ.get("CUDA_VISIBLE_DEVICES", "")
    return len([d for d in devices.split(",") if d.strip()]) or 1


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.speed_scale <= 0:
        print("--speed-scale must be positive", file=sys.stderr)
        return 2
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    job = Job.from_env()
    generation = args.generation or job.gpu_generation or REFERENCE_GENERATION
    gpus = args.num_gpus or visible_gpu_count(os.environ)
    try:
        rate, total = schedule(args, generation, gpus)
    except ThroughputLookupError as exc:
        print(f"synthetic job: {exc}", file=sys.stderr)
        return 2
    if rate <= 0:
        # Gavel records 0 for a job that did not fit in GPU memory: fail as a real one would.
        print(oom_message(args.job_type, generation, gpus), file=sys.stderr)
        return 1

    state = job.load_checkpoint()
    start = int(state["step"]) if state else 0
    print(
        f"synthetic {args.job_type!r} on {gpus}x{generation}: {rate:.3f} steps/s "
        f"(x{args.speed_scale:g}), steps {start}..{total}",
        flush=True,
    )
    step_s = 1.0 / (rate * args.speed_scale)
    deadline = time.monotonic()
    for step in range(start, total):
        if step == args.oom_at_step:
            print(oom_message(args.job_type, generation, gpus), file=sys.stderr)
            return 1
        if step == args.fail_at_step:
            print(f"synthetic job: injected failure at step {step}", file=sys.stderr)
            return int(args.exit_code)
        if step == args.hang_at_step:
            print(f"synthetic job: hanging at step {step}", file=sys.stderr, flush=True)
            while True:  # deliberately deaf to yield requests
                time.sleep(3600)
        # Sleep to a schedule, not a fixed amount, so the average rate is exact.
        deadline += step_s
        delay = deadline - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        job.report(step)
        done = step + 1
        if job.should_yield():
            job.save_checkpoint(_state(args.job_type, done))
            print(f"synthetic job: yielding at step {done}", flush=True)
            job.exit_for_yield()
        if args.checkpoint_every and done % args.checkpoint_every == 0 and done < total:
            job.save_checkpoint(_state(args.job_type, done))
    job.save_checkpoint(_state(args.job_type, total))
    job.complete()
    print(f"synthetic job: completed {total} steps", flush=True)
    job.close()
    return 0


def _state(job_type: str, step: int) -> dict[str, object]:
    # A loss curve that depends only on the step, so a resumed run is checkably the same run.
    return {"step": step, "job_type": job_type, "loss": round(2.5 / math.sqrt(1 + step), 6)}


def schedule(
    args: argparse.Namespace,
    generation: str,
    gpus: int,
    table: ThroughputTable | None = None,
) -> tuple[float, int]:
    """The job's mini-batches per second on `gpus` x `generation` (before --speed-scale; 0: it
    does not fit) and its mini-batches in total; `ThroughputLookupError` for what the table
    lacks. `table` defaults to --throughputs' (virtual nodes pass the one they loaded)."""
    if table is None and not args.steps_per_s:
        table = ThroughputTable.load(args.throughputs)
    rate = args.steps_per_s or _rate(table, args.job_type, generation, gpus)
    total = args.iterations
    if total is None:
        reference = args.steps_per_s or _rate(table, args.job_type, REFERENCE_GENERATION, gpus)
        duration_s = DEFAULT_DURATION_S if args.duration_s is None else args.duration_s
        total = max(1, math.ceil(duration_s * reference))
    return float(rate), int(total)


def _rate(table: ThroughputTable | None, job_type: str, generation: str, gpus: int) -> float:
    assert table is not None
    return table.steps_per_s(job_type, generation, gpus)


def oom_message(job_type: str, generation: str, gpus: int) -> str:
    return (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB "
        f"(synthetic {job_type!r} does not fit on {gpus}x{generation})"
    )


if __name__ == "__main__":
    sys.exit(main())
