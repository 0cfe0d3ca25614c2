"""A job's whole life on a real cluster: submitted by a tool, placed, run as a process, done."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import nats
import pytest

from gfair.client import GfairClient
from gfair.events.codec import decode
from gfair.events.commands import StartCommand
from gfair.events.jobs import JobCompleted, JobPlaced, JobStarted
from gfair.events.states import JobState
from gfair.events.subjects import COMMANDS_STREAM
from node.helpers import JOB_PYTHON
from support.jobs import settled

from .conftest import RESNET, StartCluster, client_of, synthetic

pytestmark = pytest.mark.nats


async def finished(client: GfairClient, user: str, job_id: str, timeout_s: float = 60) -> JobState:
    """Wait until the job reaches a terminal state; return it."""
    async for event in client.watch(user, job_id, timeout_s=timeout_s):
        state = getattr(event.data, "JOB_STATE", None)
        if state is not None and state.terminal:
            return JobState(state)
    raise AssertionError(f"{user}/{job_id} did not finish within {timeout_s}s")


async def test_a_job_submitted_with_the_cli_runs_and_completes(start_cluster: StartCluster) -> None:
    async with start_cluster(cluster="v100:1x2") as cluster:
        gfair = Path(sys.executable).parent / "gfair"
        submit = await asyncio.create_subprocess_exec(
            str(gfair),
            "submit",
            "--nats",
            cluster.nats_url,
            "--user",
            "alice",
            "--gpus",
            "1",
            "--job-id",
            "cli-1",
            "--job-type",
            RESNET,
            "--",
            *synthetic(iterations=40, speed_scale=10),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(submit.communicate(), 60)
        assert submit.returncode == 0, err.decode()
        async with client_of(cluster) as client:
            assert await finished(client, "alice", "cli-1") is JobState.COMPLETED
            details = await settled(client, "alice", "cli-1")
    kinds = [type(e.data).__name__ for e in details.events]
    assert kinds[:3] == ["JobAccepted", "JobPlaced", "JobStarted"]
    assert sum(isinstance(e.data, JobCompleted) for e in details.events) == 1
    assert details.record is not None and details.record.state is JobState.COMPLETED
    assert details.record.last_checkpoint_step == 40
    # The job really ran as a process that wrote its checkpoint where split-stride said.
    assert any((cluster.checkpoint_root / "alice" / "cli-1").iterdir())


async def test_a_gang_starts_on_both_servers_in_the_same_quantum(
    start_cluster: StartCluster,
) -> None:
    async with start_cluster(cluster="v100:2x2") as cluster, client_of(cluster) as client:
        submitted = await client.submit(
            "alice",
            4,
            synthetic(iterations=30, speed_scale=10),
            job_type=RESNET,
            job_id="gang",
            wait="accepted",
        )
        assert submitted.state is not JobState.REJECTED
        assert await finished(client, "alice", "gang") is JobState.COMPLETED
        details = await client.job("alice", "gang")
        starts = [
            e
            async for e in client.bus.history(COMMANDS_STREAM.name)
            if e.subject.endswith(".start")
        ]
    (placed,) = [e.data for e in details.events if isinstance(e.data, JobPlaced)]
    assert sorted(placed.servers) == ["v100-0", "v100-1"]
    started = [e for e in details.events if isinstance(e.data, JobStarted)]
    assert sorted(e.data.node_id for e in started) == ["v100-0", "v100-1"]  # type: ignore[attr-defined]
    # Both parts were started by one decision, and ran within a quantum of each other.
    commands = [decode(m.data) for m in starts]
    gang_starts = [c for c in commands if isinstance(c.data, StartCommand)]
    assert len({c.envelope.causation_id for c in gang_starts}) == 1
    assert {c.data.gpu_indices for c in gang_starts} == {(0, 1)}  # type: ignore[attr-defined]
    times = sorted(e.envelope.time for e in started)
    assert (times[-1] - times[0]).total_seconds() < cluster.options.quantum_s


# The two parts of a gang meet as distributed training's processes do: the first part listens
# on MASTER_ADDR:MASTER_PORT, the other connects and says who it is.
RENDEZVOUS = """
import os, socket, sys, time
rank, nodes = int(os.environ["NODE_RANK"]), int(os.environ["NNODES"])
where = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
if rank == 0:
    with socket.create_server(("", where[1])) as server:
        server.settimeout(30)
        peer, _ = server.accept()
        said = peer.recv(64).decode()
        print("rank 0 heard:", said)
        sys.exit(0 if said == f"rank 1 of {nodes}" else 1)
deadline = time.monotonic() + 30
while True:
    try:
        with socket.create_connection(where, timeout=2) as peer:
            peer.sendall(f"rank {rank} of {nodes}".encode())
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
"""


async def test_the_parts_of_a_gang_across_servers_find_each_other(
    start_cluster: StartCluster,
) -> None:
    async with start_cluster(cluster="v100:2x2") as cluster, client_of(cluster) as client:
        await client.submit(
            "alice", 4, [JOB_PYTHON, "-c", RENDEZVOUS], job_id="ddp", wait="accepted"
        )
        # Completed only if both parts exited 0: rank 0 heard rank 1 at the address both got.
        assert await finished(client, "alice", "ddp") is JobState.COMPLETED


async def test_a_job_published_as_plain_json_is_scheduled(start_cluster: StartCluster) -> None:
    """Any program that can publish JSON to NATS can submit: no gfair code on this side."""
    async with start_cluster(cluster="v100:1x1") as cluster:
        connection = await nats.connect(cluster.nats_url)
        try:
            envelope = {
                "id": uuid.uuid4().hex,
                "type": "gfair.job.submitted.v1",
                "source": "plain-json-tool",
                "time": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                "subject": "gfair.submit.dave",
                "data": {
                    "user": "dave",
                    "job_id": "plain-1",
                    "gpus": 1,
                    "command": synthetic(iterations=20, speed_scale=10),
                    "job_type": RESNET,
                },
            }
            ack = await connection.jetstream().publish(
                "gfair.submit.dave",
                json.dumps(envelope).encode(),
                headers={"Nats-Msg-Id": envelope["id"]},
            )
            assert ack.stream == "GFAIR_JOBS"
        finally:
            await connection.close()
        async with client_of(cluster) as client:
            assert await finished(client, "dave", "plain-1") is JobState.COMPLETED
            details = await client.job("dave", "plain-1")
    assert any(isinstance(e.data, JobStarted) for e in details.events)
