"""Real training through a live cluster: `examples/pytorch_train.py` (torch on the CPU) time-sliced
beside other jobs, parked in place on its node and moved between servers, ends with exactly the
weights and optimizer state of an uninterrupted run."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gfair.events.jobs import JobProgress, JobResumed, JobStarted, JobSuspended
from gfair.events.reasons import SuspendReason
from gfair.events.states import JobState
from gfair.sdk.checkpoint import MANIFEST_NAME
from node.helpers import JOB_PYTHON, LIBS
from training_state import PINNED_THREADS, equal

from .conftest import FREE_MOVES, RESNET, StartCluster, client_of, moved_off_its_node, synthetic
from .test_job_life import finished, settled

torch = pytest.importorskip("torch", reason="real training needs torch (pip install torch)")

pytestmark = [pytest.mark.nats, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pytorch_train.py"
STEPS = 30000
# Twice the example's default work per step, so that the run outlasts its 20 parks and 3 moves
# on a fast, quiet machine too (with homes it is time-sliced in place, less often than before).
SIZE = ["--batch-size", "256"]


def final_tensors(checkpoints: Path) -> dict[str, Any]:
    """model and optimizer state of the checkpoint of the last step under `checkpoints`."""
    for manifest in sorted(checkpoints.rglob(MANIFEST_NAME), reverse=True):
        if json.loads(manifest.read_text())["step"] == STEPS:
            loaded: dict[str, Any] = torch.load(manifest.parent / "model.pt", weights_only=True)
            return loaded
    raise AssertionError(f"no checkpoint of step {STEPS} under {checkpoints}")


def uninterrupted(directory: Path) -> dict[str, Any]:
    directory.mkdir()
    env = {**os.environ, "PYTHONPATH": str(LIBS), **PINNED_THREADS}
    for name in ("GFAIR_JOB_ID", "GFAIR_CONTROL_DIR", "GFAIR_CHECKPOINT_DIR"):
        env.pop(name, None)
    subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", str(STEPS), *SIZE],
        cwd=directory,
        env=env,
        check=True,
        capture_output=True,
    )
    return final_tensors(directory / ".gfair" / "checkpoints")


def switches(events: list[Any]) -> tuple[int, int]:
    """In-place suspends, and moves to the other server (a new process there)."""
    parked = sum(1 for e in events if isinstance(e, JobSuspended) and e.in_place)
    starts = [
        e
        for e in events
        if isinstance(e, JobStarted) or (isinstance(e, JobResumed) and not e.in_place)
    ]
    moves = sum(1 for a, b in itertools.pairwise(starts) if a.node_id != b.node_id)
    return parked, moves


async def test_pytorch_training_parked_in_place_and_moved_ends_bitwise_equal(
    start_cluster: StartCluster, tmp_path: Path
) -> None:
    # A two-GPU and a one-GPU server, four jobs: alice's training takes turns with bob's three
    # synthetic ones (tickets 1:3), back on the server it parked on (in place); every fourth park
    # its node is quarantined, so it moves to the other one (its node checkpoints it, and the
    # new one starts from that checkpoint). The
    # grace lets a cold start (importing torch takes seconds) reach its first mini-batch. Once
    # it switched enough, bob's jobs end and it trains alone to the end: how fast it gets
    # there with half-second slices depends on this machine's load, not on what is tested.
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
        train = [JOB_PYTHON, str(EXAMPLE), "--steps", str(STEPS), *SIZE]
        await client.submit("alice", 1, train, job_id="train", env=PINNED_THREADS)
        deadline = time.monotonic() + 180
        while True:
            details = await client.job("alice", "train")
            events = [e.data for e in details.events]
            parked, moves = switches(events)
            if parked >= 20 and moves >= 3:
                break
            if moves < 3 and parked >= 4 * (moves + 1):
                await moved_off_its_node(client, "alice", "train", timeout_s=60)
                continue
            assert not details.state.terminal, f"ended after {parked} parks, {moves} moves"
            assert time.monotonic() < deadline, f"{parked} parks, {moves} moves: {events[-6:]}"
            await asyncio.sleep(1.0)
        for name in ("b1", "b2", "b3"):
            await client.cancel("bob", name, wait=False)
        state = await finished(client, "alice", "train", timeout_s=180)
        details = await settled(client, "alice", "train")
    assert state is JobState.COMPLETED, [e.data for e in details.events][-5:]
    events = [e.data for e in details.events]
    suspends = [e for e in events if isinstance(e, JobSuspended)]
    resumed_in_place = [e for e in events if isinstance(e, JobResumed) and e.in_place]
    assert resumed_in_place, "never resumed in place"
    # Every switch is measured: suspends to GPUs free, in-place resumes to the first new step.
    assert all(s.duration_s is not None for s in suspends)
    assert all(r.duration_s is not None for r in resumed_in_place)
    # A cold start's first report says how long it took to its first mini-batch.
    assert any(isinstance(e, JobProgress) and e.first_step_s is not None for e in events)

    reference = uninterrupted(tmp_path / "reference")
    sliced = final_tensors(tmp_path / "gfair")
    assert equal(sliced["model"], reference["model"])
    assert equal(sliced["optimizer"], reference["optimizer"])


async def test_a_prepared_start_imports_torch_before_it_holds_a_gpu(
    start_cluster: StartCluster,
) -> None:
    # Bob's job holds the only GPU when alice's training arrives, submitted with `prepare`: its
    # process starts without a GPU, imports torch and parks in Job.from_env(); its first slice
    # resumes that process in place, and it trains to the end.
    async with (
        start_cluster(
            cluster="v100:1x1",
            quantum_s=1.0,
            user_tickets={"alice": 1.0, "bob": 1.0},
            env={"GFAIR_YIELD_GRACE_S": "5"},
        ) as cluster,
        client_of(cluster) as client,
    ):
        await client.submit(
            "bob",
            1,
            synthetic(duration_s=3600, speed_scale=10),
            job_type=RESNET,
            job_id="b",
            wait="running",
            timeout_s=60,
        )
        train = [JOB_PYTHON, str(EXAMPLE), "--steps", "2000"]
        await client.submit("alice", 1, train, job_id="train", prepare=True)
        deadline = time.monotonic() + 120
        while not any(
            isinstance(e.data, JobResumed) for e in (await client.job("alice", "train")).events
        ):
            assert time.monotonic() < deadline, "its first slice never came"
            await asyncio.sleep(0.5)
        await client.cancel("bob", "b", wait=False)
        state = await finished(client, "alice", "train", timeout_s=180)
        details = await settled(client, "alice", "train")
    events = [e.data for e in details.events]
    assert state is JobState.COMPLETED, events[-5:]
    # Parked before it ever held a GPU, then continued in that process: never started anew.
    first = next(e for e in events if isinstance(e, JobSuspended | JobResumed | JobStarted))
    assert isinstance(first, JobSuspended) and first.in_place
    assert first.reason is SuspendReason.PREPARED
    assert not any(isinstance(e, JobStarted) for e in events)
    resumed = next(e for e in events if isinstance(e, JobResumed))
    assert resumed.in_place and resumed.duration_s is not None
