"""A control plane and two GPU servers on hosts of their own (issue 46, item 2).

Each host is a Docker network of its own: the control plane's project (compose.yaml's broker,
six services and query, and no executor) on one, and a project of
deploy/gpu-server/compose.yaml, one simulated V100, on each of two others. A fourth network,
the "wan", joins only the control plane's broker (as `control-plane`) and the servers'
executors: the broker's port is all that crosses between the hosts. Checkpoints are on a named
volume both servers mount, standing in for the shared store.

The servers' logins are added as the operator adds them (`gfair tenants add-node`, then the
broker recreated), the second one while the control plane runs. A gang of two GPUs spans both
servers and completes; then one server's executor is killed while single-GPU jobs run, and
its job is re-placed on the other server. No job is lost or ends twice, and no GPU is held by
two jobs at once.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from bench.compose_deployment import (
    COMPOSE_FILE,
    CONTROL_PLANE,
    ROOT,
    SYNTHETIC_JOB,
    SYNTHETIC_JOB_TYPE,
    ComposeProject,
    docker,
    fresh_secrets,
)

from gfair.client import GfairClient
from gfair.client.job_history import Outcomes, gpu_overlaps, job_history
from gfair.events.codec import DecodedEvent
from gfair.events.jobs import (
    JobCheckpointed,
    JobCompleted,
    JobPlaced,
    JobStarted,
    RunReport,
)
from gfair.events.states import JobState, NodeState

from .conftest import ProjectFactory

HERE = Path(__file__).parent / "two_hosts"
GPU_SERVER_FILE = ROOT / "deploy" / "gpu-server" / "compose.yaml"
SERVERS = ("gpu-a", "gpu-b")
RESNET = SYNTHETIC_JOB_TYPE
STEPS_PER_S = 4
RUNNING = {"JobStarted", "JobResumed"}
STOPPED = {"JobSuspended", "JobMigrated", "JobExited"}


def synthetic(seconds: float) -> list[str]:
    """A job of `seconds` of training that checkpoints every second, run in the executor."""
    steps = ["--steps-per-s", str(STEPS_PER_S), "--iterations", str(round(seconds * STEPS_PER_S))]
    return [*SYNTHETIC_JOB, "--job-type", RESNET, *steps, "--checkpoint-every", str(STEPS_PER_S)]


@dataclass(frozen=True)
class Links:
    """What the hosts share: the network between them and the checkpoint store."""

    wan: str
    checkpoints: str


@pytest.fixture
def links() -> Iterator[Links]:
    """Made before the projects (ask for it before `compose_project`), so removed after them."""
    name = f"gfair-t{uuid.uuid4().hex[:8]}"
    made = Links(wan=f"{name}-wan", checkpoints=f"{name}-checkpoints")
    docker("network", "create", made.wan)
    docker("volume", "create", made.checkpoints)
    yield made
    docker("network", "rm", made.wan, check=False)
    docker("volume", "rm", made.checkpoints, check=False)


def add_node(tenants: Path, node_id: str, operator_env: Path) -> dict[str, str]:
    """`gfair tenants add-node` on the control-plane host: the server's .env lines."""
    gfair = shutil.which("gfair", path=str(Path(sys.executable).parent))
    assert gfair is not None
    done = subprocess.run(
        [gfair, "tenants", "add-node", str(tenants), node_id, "--env", str(operator_env)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return dict(line.split("=", 1) for line in done.stdout.splitlines())


def tcp_from(project: ComposeProject, service: str, host: str, port: int) -> str:
    """'open', or why a connection from inside `service`'s container to host:port failed."""
    probe = (
        "import socket, sys\n"
        "try:\n"
        "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()\n"
        "    print('open')\n"
        "except OSError as error:\n"
        "    print(type(error).__name__)\n"
    )
    container = project.container_id(service)
    return docker("exec", container, "/opt/gfair/bin/python", "-c", probe, host, str(port)).strip()


def addresses(container: str) -> dict[str, str]:
    """The container's address on each network it is attached to."""
    out = docker(
        "inspect",
        "-f",
        "{{range $n, $e := .NetworkSettings.Networks}}{{$n}}={{$e.IPAddress}} {{end}}",
        container,
    )
    return dict(pair.split("=", 1) for pair in out.split())


async def until(
    check: Callable[[], Awaitable[bool]],
    timeout_s: float,
    what: str,
    projects: Sequence[ComposeProject] = (),
) -> None:
    """Polls `check` until it holds; past `timeout_s`, fails with the projects' last logs."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            logs = "\n".join(project.logs() for project in projects)
            raise AssertionError(f"{what}: not within {timeout_s:g} s\n{logs}")
        await asyncio.sleep(0.5)


def runs(events: list[DecodedEvent], job_id: str) -> list[tuple[str, str]]:
    """(event type, reporting node) of the job's run reports, in stream order."""
    return [
        (type(e.data).__name__, e.data.reporter)
        for e in events
        if isinstance(e.data, RunReport) and e.data.job_id == job_id
    ]


def running_on(events: list[DecodedEvent], node_id: str) -> str | None:
    """A job that runs on `node_id` now and has checkpointed there since it (re)started."""
    for job_id in sorted({e.data.job_id for e in events if isinstance(e.data, JobStarted)}):
        reports = runs(events, job_id)
        starts = [i for i, (kind, _) in enumerate(reports) if kind in RUNNING]
        since = reports[starts[-1] :] if starts else []
        kinds = {kind for kind, _ in since[1:]}
        if since and since[0][1] == node_id and "JobCheckpointed" in kinds and not kinds & STOPPED:
            return job_id
    return None


async def test_a_gang_spans_two_gpu_hosts_and_a_lost_hosts_job_moves_to_the_other(
    links: Links, compose_project: ProjectFactory, tmp_path: Path
) -> None:
    # The operator's files on the control-plane host: its .env, the tenants file and the
    # rendered auth.conf the broker mounts.
    tenants = tmp_path / "tenants.toml"
    shutil.copy(ROOT / "deploy" / "nats" / "tenants.toml", tenants)
    operator_env = tmp_path / "control-plane.env"
    secrets = fresh_secrets()
    operator_env.write_text("".join(f"{k}={v}\n" for k, v in secrets.items()))
    plane = compose_project(
        files=(COMPOSE_FILE, HERE / "control-plane.yaml"),
        secrets=secrets,
        extra={
            "GFAIR_NATS_AUTH_CONF": str(tmp_path / "auth.conf"),
            "GFAIR_TEST_OPERATOR_ENV": str(operator_env),
            "GFAIR_TEST_WAN": links.wan,
        },
    )

    def server(lines: dict[str, str]) -> ComposeProject:
        return compose_project(
            files=(GPU_SERVER_FILE, HERE / "gpu-server.yaml"),
            secrets=lines,
            extra={
                "GFAIR_CONTROL_PLANE_URL": "nats://control-plane:4222",
                "GFAIR_CHECKPOINTS": links.checkpoints,
                "GFAIR_SIMULATE_GPUS": "v100:1",
                "GFAIR_TEST_WAN": links.wan,
            },
        )

    started = time.monotonic()
    host_a = server(add_node(tenants, "gpu-a", operator_env))
    plane.up("nats", *CONTROL_PLANE)
    host_a.up()
    # The second server joins the running control plane: its login, then the broker recreated
    # with it (compose sees its environment changed), as docs/deployment.md says.
    host_b = server(add_node(tenants, "gpu-b", operator_env))
    plane.up("nats")
    host_b.up()
    up_s = time.monotonic() - started

    # Only the broker crosses: the wan holds it and the two executors, and an executor reaches
    # the broker but not a control-plane service's port that listens on its own network.
    attached = docker(
        "network", "inspect", "-f", "{{range .Containers}}{{.Name}} {{end}}", links.wan
    )
    assert sorted(attached.split()) == sorted(
        [f"{plane.name}-nats-1", f"{host_a.name}-node-executor-1", f"{host_b.name}-node-executor-1"]
    )
    (placement_ip,) = addresses(plane.container_id("placement")).values()
    assert tcp_from(plane, "profiler", placement_ip, 9464) == "open"  # it does listen
    for host in (host_a, host_b):
        assert tcp_from(host, "node-executor", "control-plane", 4222) == "open"
        assert tcp_from(host, "node-executor", placement_ip, 9464) != "open"

    operator = await GfairClient.connect(options=plane.login("operator", "GFAIR_OPERATOR_PASSWORD"))
    alice = await GfairClient.connect(options=plane.login("alice", "GFAIR_TENANT_ALICE_PASSWORD"))
    async with operator, alice:

        async def both_ready() -> bool:
            nodes = {n.node_id: n for n in await operator.nodes()}
            return all(
                s in nodes and nodes[s].state is NodeState.READY and len(nodes[s].gpus) == 1
                for s in SERVERS
            )

        hosts = (plane, host_a, host_b)
        await until(both_ready, 90, "both GPU servers registered and ready", hosts)

        async def ended(*job_ids: str) -> bool:
            records = {r.job_id: r for r in await operator.jobs("alice")}
            return all(j in records and records[j].state.terminal for j in job_ids)

        # A gang of two GPUs: one on each server.
        await alice.submit("alice", 2, synthetic(4), job_type=RESNET, job_id="gang")
        await until(lambda: ended("gang"), 90, "the gang ended", hosts)

        singles = [f"single-{n}" for n in range(3)]
        for job_id in singles:
            await alice.submit("alice", 1, synthetic(10), job_type=RESNET, job_id=job_id)
        victim: str | None = None

        async def one_runs_on_a() -> bool:
            nonlocal victim
            victim = running_on(await job_history(operator.bus), "gpu-a")
            return victim is not None

        await until(one_runs_on_a, 90, "a job running and checkpointed on gpu-a", hosts)
        killed_at = time.monotonic()
        docker("kill", host_a.container_id("node-executor"))  # stays down: not a restart
        await until(lambda: ended(*singles), 180, "the single-GPU jobs ended", hosts)
        moved_s = time.monotonic() - killed_at
        history = await job_history(operator.bus)
        nodes = {n.node_id: n for n in await operator.nodes()}
        records = {r.job_id: r for r in await operator.jobs("alice")}

    print(
        f"\ntwo hosts: up in {up_s:.0f} s; the singles ended {moved_s:.0f} s after gpu-a's "
        f"executor was killed"
    )
    assert all(records[j].state is JobState.COMPLETED for j in ["gang", *singles]), records
    (placed,) = [
        e.data for e in history if isinstance(e.data, JobPlaced) and e.data.job_id == "gang"
    ]
    assert sorted(placed.servers) == list(SERVERS)
    assert sorted(node for kind, node in runs(history, "gang") if kind == "JobStarted") == list(
        SERVERS
    )
    # The lost server's job ran again on the other one, from its checkpoint, and completed.
    assert victim is not None
    reports = runs(history, victim)
    last_on_a = max(i for i, (_, node) in enumerate(reports) if node == "gpu-a")
    assert ("JobResumed", "gpu-b") in reports[last_on_a:], reports
    # From the checkpoint gpu-a wrote to the shared store: gpu-b's first one is further on.
    checkpoints = [
        (e.data.node_id, e.data.step)
        for e in history
        if isinstance(e.data, JobCheckpointed) and e.data.job_id == victim
    ]
    last_a = max(i for i, (node, _) in enumerate(checkpoints) if node == "gpu-a")
    (node, step), *_ = checkpoints[last_a + 1 :]
    assert node == "gpu-b" and step > checkpoints[last_a][1], checkpoints
    assert nodes["gpu-a"].state is NodeState.FAILED
    outcomes = Outcomes.of(history)
    assert outcomes.problems({("alice", j) for j in ["gang", *singles]}) == []
    assert isinstance(outcomes.end(("alice", victim)), JobCompleted)
    overlaps, intervals = gpu_overlaps(history)
    assert overlaps == [] and intervals > 0
