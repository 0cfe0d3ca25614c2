"""Lightning and the Hugging Face Trainer through a live cluster, with gfair's callbacks: time
sliced beside other jobs, the job parks in place on its node and resumes in the same process,
moves between servers through a checkpoint, and ends with exactly the weights and optimizer
state of an uninterrupted run."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gfair.events.jobs import JobResumed
from gfair.events.states import JobState
from gfair.sdk.checkpoint import MANIFEST_NAME
from node.helpers import JOB_PYTHON, LIBS
from training_state import PINNED_THREADS, equal

from .conftest import FREE_MOVES, RESNET, StartCluster, client_of, moved_off_its_node, synthetic
from .test_job_life import finished, settled
from .test_real_training import switches

torch = pytest.importorskip("torch", reason="real training needs torch (pip install torch)")

pytestmark = [pytest.mark.nats, pytest.mark.slow]

JOB = Path(__file__).with_name("framework_job.py")
FINAL_FILE = "final.pt"
STEPS = 2000
FRAMEWORKS = {"lightning": "lightning.pytorch", "transformers": "transformers"}


def final_state(checkpoints: Path) -> dict[str, Any]:
    for manifest in sorted(checkpoints.rglob(MANIFEST_NAME), reverse=True):
        if json.loads(manifest.read_text())["step"] == STEPS:
            loaded: dict[str, Any] = torch.load(manifest.parent / FINAL_FILE, weights_only=True)
            return loaded
    raise AssertionError(f"no checkpoint of step {STEPS} under {checkpoints}")


def uninterrupted(framework: str, directory: Path) -> dict[str, Any]:
    directory.mkdir()
    env = {**os.environ, "PYTHONPATH": str(LIBS), **PINNED_THREADS}
    for name in ("GFAIR_JOB_ID", "GFAIR_CONTROL_DIR", "GFAIR_CHECKPOINT_DIR"):
        env.pop(name, None)
    subprocess.run(
        [sys.executable, str(JOB), framework, "--steps", str(STEPS)],
        cwd=directory,
        env=env,
        check=True,
        capture_output=True,
    )
    return final_state(directory / ".gfair" / "checkpoints")


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
async def test_framework_training_parked_in_place_and_moved_ends_bitwise_equal(
    framework: str, start_cluster: StartCluster, tmp_path: Path
) -> None:
    pytest.importorskip(FRAMEWORKS[framework])
    # As tests/e2e/test_real_training.py: a two-GPU and a one-GPU server, alice's training
    # takes turns with bob's three synthetic jobs, parked in place or moved to the other
    # server. It trains slowly (a sleep after each step) until it switched enough, then alone
    # and at full speed to the end.
    go = tmp_path / "go"
    async with (
        start_cluster(
            cluster="v100:1x2,v100:1x1",
            quantum_s=0.5,
            user_tickets={"alice": 1.0, "bob": 3.0},
            env={"GFAIR_YIELD_GRACE_S": "5", **FREE_MOVES},
        ) as cluster,
        client_of(cluster) as client,
    ):
        for name in ("b1", "b2", "b3"):
            await client.submit(
                "bob", 1, synthetic(duration_s=3600, speed_scale=10), job_type=RESNET, job_id=name
            )
        train = [JOB_PYTHON, str(JOB), framework, "--steps", str(STEPS), "--slow-until", str(go)]
        await client.submit("alice", 1, train, job_id="train", env=PINNED_THREADS)
        deadline = time.monotonic() + 120
        while True:
            details = await client.job("alice", "train")
            events = [e.data for e in details.events]
            parked, moves = switches(events)
            # Resumed in place: the same process went on (a restart is a start or a resume
            # from a checkpoint, never `in_place`). A park may also end in a move.
            resumed = sum(1 for e in events if isinstance(e, JobResumed) and e.in_place)
            if parked >= 3 and resumed >= 2 and moves >= 1:
                break
            if moves < 1 and parked >= 3:
                await moved_off_its_node(client, "alice", "train", timeout_s=60)
                continue
            assert not details.state.terminal, f"ended after {parked} parks, {moves} moves"
            assert time.monotonic() < deadline, f"{parked} parks, {moves} moves: {events[-6:]}"
            await asyncio.sleep(0.5)
        go.touch()
        for name in ("b1", "b2", "b3"):
            await client.cancel("bob", name, wait=False)
        state = await finished(client, "alice", "train", timeout_s=120)
        details = await settled(client, "alice", "train")
    events = [e.data for e in details.events]
    assert state is JobState.COMPLETED, events[-5:]

    reference = uninterrupted(framework, tmp_path / "reference")
    sliced = final_state(tmp_path / "gfair")
    assert equal(sliced["model"], reference["model"])
    assert equal(sliced["optimizer"], reference["optimizer"])
