"""Jobs for the live reliability tests: the synthetic job, and one that fails once like bad iron.

The synthetic job is told its rate (`--steps-per-s`), so it neither reads the throughput table
nor spins through hundreds of tiny steps: a few steps a second keeps dozens of them cheap on a
2-core machine while they checkpoint, yield and resume like real training.
"""

from __future__ import annotations

import sys
from pathlib import Path

STEPS_PER_S = 4.0
RESNET = "ResNet-50 (batch size 32)"
FLAKY_JOB = Path(__file__).with_name("flaky_job.py")


def synthetic(
    seconds: float,
    *,
    fail_at_step: int | None = None,
    oom_at_step: int | None = None,
    checkpoint_every: int | None = None,
) -> list[str]:
    """A job of `seconds` of training at `STEPS_PER_S`, with an injected failure if asked."""
    argv = [
        sys.executable,
        "-m",
        "gfair.sdk.synthetic",
        "--job-type",
        RESNET,
        "--steps-per-s",
        f"{STEPS_PER_S:g}",
        "--iterations",
        str(max(1, round(seconds * STEPS_PER_S))),
    ]
    if fail_at_step is not None:
        argv += ["--fail-at-step", str(fail_at_step), "--exit-code", "3"]
    if oom_at_step is not None:
        argv += ["--oom-at-step", str(oom_at_step)]
    if checkpoint_every is not None:
        argv += ["--checkpoint-every", str(checkpoint_every)]
    return argv


def flaky(marker: Path, seconds: float) -> list[str]:
    """Fails its first run with a GPU-fell-off-the-bus XID in stderr, then trains normally."""
    return [sys.executable, str(FLAKY_JOB), str(marker), *synthetic(seconds)[3:]]
