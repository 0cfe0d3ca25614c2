"""deploy/compose.containers.yaml: the compose deployment's executor runs a tenant's job in its
own image through the host's engine (a sibling container, not a nested one), time-sliced on
one GPU beside another tenant's process job.

The job is examples/pytorch_train.py in the example image (examples/images/pytorch), submitted
with the host's `gfair submit --image` as alice.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench.compose_deployment import COMPOSE_FILE, CONTROL_PLANE, ROOT, connected, docker, synthetic

from gfair.events.jobs import JobResumed, JobStarted
from gfair.events.states import JobState
from gfair.node.container_jobs import LABEL_RUNS
from gfair.sdk.environment import PROGRESS_FILE

from .conftest import ProjectFactory, unavailable
from .test_engine import cli

CONTAINERS_FILE = ROOT / "deploy" / "compose.containers.yaml"
EXECUTOR_UID = 10001  # the gfair image's user (deploy/Dockerfile)
SOCKET = Path("/var/run/docker.sock")


@pytest.fixture
def socket_group() -> int:
    """The engine socket's group, which the executor joins."""
    if not SOCKET.is_socket():
        unavailable(f"the engine has no socket at {SOCKET} to give the executor")
    return SOCKET.stat().st_gid


@pytest.fixture
def jobs_dir() -> Iterator[Path]:
    """The host directory of the executor's run and checkpoint directories, as the overlay's
    comment has an operator make it: owned by the executor's user, reachable by it."""
    path = Path(tempfile.mkdtemp(prefix="gfair-jobs-", dir="/var/tmp"))
    path.chmod(0o755)
    os.chown(path, EXECUTOR_UID, EXECUTOR_UID)
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_a_tenants_job_in_its_image_time_slices_beside_another_tenants_job(
    compose_project: ProjectFactory, example_image: str, socket_group: int, jobs_dir: Path
) -> None:
    project = compose_project(
        files=[COMPOSE_FILE, CONTAINERS_FILE],
        extra={
            "GFAIR_JOBS_DIR": str(jobs_dir),
            "GFAIR_JOB_IMAGES": "gfair-example/",
            "GFAIR_DOCKER_GID": str(socket_group),
            "GFAIR_SIMULATE_GPUS": "v100:1",  # one GPU: alice's and bob's jobs take turns
            "GFAIR_QUANTUM_S": "3",
        },
    )
    project.up("nats", *CONTROL_PLANE, "node-executor")
    alice = project.login("alice", "GFAIR_TENANT_ALICE_PASSWORD")
    bob = project.login("bob", "GFAIR_TENANT_BOB_PASSWORD")
    client = await connected(project.login("operator", "GFAIR_OPERATOR_PASSWORD"), project)
    async with client:
        # Bob's process job holds the GPU first.
        cli(
            project, bob, "submit", "--job-id", "b", "--gpus", "1", "--wait", "--", *synthetic(3600)
        )
        cli(
            project,
            alice,
            *("submit", "--job-id", "train", "--gpus", "1", "--image", example_image),
            *("--env", "OMP_NUM_THREADS=1", "--wait=completed", "--timeout", "600"),
            *("--", "python", "/opt/example/pytorch_train.py", "--steps", "12000"),
        )
        details = await client.job("alice", "train")
        assert details.state is JobState.COMPLETED, project.logs(["node-executor"])
        events = [e.data for e in details.events]
        resumed = [e for e in events if isinstance(e, JobResumed) and e.in_place]
        assert len(resumed) >= 2, events  # parked in place between its slices
        assert len([e for e in events if isinstance(e, JobStarted)]) == 1  # one container
    # A sibling of the executor in the host's engine, its files on the host's directory.
    runs = jobs_dir / "work" / "sim-1" / "runs" / "alice"
    assert any(runs.glob(f"train/run-*/control/{PROGRESS_FILE}"))
    assert docker("ps", "-aq", "--filter", f"label={LABEL_RUNS}={runs}").strip() == ""
