"""A job type or GPU generation gfair has no measured speeds for is accepted with one warning
that says which speeds are assumed (the scheduler's defaults until the profiler measures)."""

from __future__ import annotations

import pytest

from gfair.cli.main import main
from gfair.cli.speeds import generation_warnings, job_type_warning
from gfair.core.throughput import DEFAULT_SPEEDS

UNREACHABLE = ["--nats", "nats://127.0.0.1:1"]
RESNET = "ResNet-50 (batch size 32)"


def test_an_unmeasured_job_type_is_sent_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["submit", "--user", "alice", "--gpus", "1", "--job-type", "NoSuchModel"]
    # It goes on to connect (exit 3: nothing listens): a warning, not a refusal.
    assert main([*flags, *UNREACHABLE, "--", "true"]) == 3
    err = capsys.readouterr().err
    (warning,) = [line for line in err.splitlines() if "warning" in line]
    assert "'NoSuchModel'" in warning and f"v100 {DEFAULT_SPEEDS['v100']:g}" in warning


def test_a_measured_job_type_says_nothing_and_a_near_miss_is_named() -> None:
    assert job_type_warning(RESNET) is None
    assert job_type_warning(None) is None
    near = job_type_warning(RESNET.lower())
    assert near is not None and f"did you mean {RESNET!r}" in near


def test_unmeasured_generations_are_named_with_the_speed_assumed() -> None:
    assert generation_warnings(["v100", "k80", "p100"]) == []
    h100, unknown = generation_warnings(["h100", "v100", "zz9", "h100"])
    ratio = DEFAULT_SPEEDS["h100"] / DEFAULT_SPEEDS["v100"]
    assert h100.startswith("no measured speeds for h100 GPUs") and f"{ratio:.2g}x a V100" in h100
    assert "zz9" in unknown and f"{1 / DEFAULT_SPEEDS['v100']:.2g}x a V100" in unknown
