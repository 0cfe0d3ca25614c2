"""The synthetic job as a real process, driven by hand (the supervisor tests drive it too)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gfair.sdk import YIELD_EXIT_CODE, CheckpointStore
from gfair.sdk.environment import (
    ENV_CHECKPOINT_DIR,
    ENV_CONTROL_DIR,
    ENV_GPU_GENERATION,
    ENV_JOB_ID,
    PROGRESS_FILE,
)
from support.waiting import eventually_sync

SYNTHETIC = [sys.executable, "-m", "gfair.sdk.synthetic"]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GFAIR_")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return {**env, **extra}


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SYNTHETIC, *args], cwd=cwd, env=clean_env(**env), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def step_range(stdout: str) -> tuple[int, int]:
    match = re.search(r"steps (\d+)\.\.(\d+)", stdout)
    assert match, stdout
    return int(match.group(1)), int(match.group(2))


def test_runs_to_completion_outside_gfair_and_resumes_at_the_end(tmp_path: Path) -> None:
    first = run(["--iterations", "12", "--speed-scale", "50"], tmp_path)
    assert first.returncode == 0, first.stderr
    assert step_range(first.stdout) == (0, 12)
    latest = CheckpointStore(tmp_path / ".gfair" / "checkpoints").latest()
    assert latest is not None and latest.step == 12

    second = run(["--iterations", "12", "--speed-scale", "50"], tmp_path)
    assert second.returncode == 0
    assert step_range(second.stdout) == (12, 12)


def test_duration_is_measured_in_v100_seconds(tmp_path: Path) -> None:
    # ResNet-50 bs32 runs 7.787 steps/s on one V100: 2 V100-seconds are 16 mini-batches.
    done = run(["--duration-s", "2", "--speed-scale", "100", "--generation", "k80"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert step_range(done.stdout) == (0, 16)
    assert "1xk80: 1.237 steps/s" in done.stdout


def test_without_a_length_it_trains_a_minute_on_a_v100(tmp_path: Path) -> None:
    # `python -m gfair.sdk.synthetic` as the README's quick start runs it: 60 V100-seconds of
    # ResNet-50 bs32 (7.787 steps/s) are 468 mini-batches, whatever the GPU it runs on.
    done = run(["--speed-scale", "200", "--generation", "k80"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert step_range(done.stdout) == (0, 468)


def test_injected_failure_exits_with_the_given_code(tmp_path: Path) -> None:
    done = run(
        ["--iterations", "50", "--speed-scale", "100", "--fail-at-step", "5", "--exit-code", "3"],
        tmp_path,
    )
    assert done.returncode == 3
    assert "injected failure at step 5" in done.stderr


def test_injected_oom_looks_like_pytorch(tmp_path: Path) -> None:
    done = run(["--iterations", "50", "--speed-scale", "100", "--oom-at-step", "2"], tmp_path)
    assert done.returncode == 1
    assert "CUDA out of memory" in done.stderr


def test_a_job_that_does_not_fit_dies_of_oom(tmp_path: Path) -> None:
    done = run(
        ["--iterations", "5", "--job-type", "ResNet-50 (batch size 128)", "--num-gpus", "2"],
        tmp_path,
        **{ENV_GPU_GENERATION: "k80"},
    )
    assert done.returncode == 1
    assert "CUDA out of memory" in done.stderr


def test_unknown_job_type_is_a_usage_error(tmp_path: Path) -> None:
    done = run(["--iterations", "5", "--job-type", "ResNet-51"], tmp_path)
    assert done.returncode == 2
    assert "unknown job type 'ResNet-51'" in done.stderr


def test_sigusr1_makes_it_checkpoint_and_yield_then_it_resumes(tmp_path: Path) -> None:
    env = clean_env(
        **{
            ENV_JOB_ID: "synthetic-1",
            ENV_CHECKPOINT_DIR: str(tmp_path / "ck"),
            ENV_CONTROL_DIR: str(tmp_path / "control"),
            ENV_GPU_GENERATION: "v100",
        }
    )
    args = ["--iterations", "400", "--speed-scale", "40"]  # ~311 steps/s: ~1.3 s in all
    process = subprocess.Popen([*SYNTHETIC, *args], cwd=tmp_path, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    # Ready (SIGUSR1 handled), its first mini-batch and a sampled one: running.
    progress = tmp_path / "control" / PROGRESS_FILE
    eventually_sync(lambda: progress.exists() and len(progress.read_text().splitlines()) >= 3, 20)
    process.send_signal(signal.SIGUSR1)
    _, err = process.communicate(timeout=20)
    assert process.returncode == YIELD_EXIT_CODE, err

    checkpoint = CheckpointStore(tmp_path / "ck").latest()
    assert checkpoint is not None
    assert 0 < checkpoint.step < 400
    assert checkpoint.state["loss"] == pytest.approx(2.5 / (1 + checkpoint.step) ** 0.5, rel=1e-5)

    resumed = subprocess.run([*SYNTHETIC, *args], cwd=tmp_path, env=env, text=True,
                             capture_output=True, timeout=60)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert step_range(resumed.stdout) == (checkpoint.step, 400)
