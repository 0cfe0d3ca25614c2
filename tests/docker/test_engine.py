"""compose.yaml in a real Docker engine, as its users run it: the image built, the deployment
up, tools on the host submitting through the published broker port as a tenant and as the
operator, every kind of container crashed mid-workload, and the whole deployment taken down
and up again on its volumes. The judge is the `GFAIR_JOBS` stream: 0 jobs lost, 0 ended
twice, 0 GPUs double-booked, every job's events from submission to its end.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench.compose_deployment import (
    CONTROL_PLANE,
    ROOT,
    ComposeProject,
    Images,
    connected,
    docker,
    synthetic,
)

from gfair.bus.transport import BusError
from gfair.client import ConnectOptions, GfairClient, NoCluster
from gfair.client.job_history import Job, Outcomes, gpu_overlaps, job_history
from gfair.events.jobs import JobCompleted, JobStarted
from gfair.events.states import JobState
from gfair.events.submission import JobSubmitted

from .conftest import ProjectFactory

EXECUTOR = "node-executor"
DEPLOYMENT = ("nats", *CONTROL_PLANE, EXECUTOR)
HA_FILE = ROOT / "deploy" / "compose.ha.yaml"
GFAIR = str(Path(sys.executable).parent / "gfair")


def cli(project: ComposeProject, login: ConnectOptions, *args: str) -> str:
    """The `gfair` CLI on the host, as an operator runs it, logged in by its environment."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "GFAIR_NATS_URL": ",".join(login.servers),
        "GFAIR_NATS_USER": str(login.user),
        "GFAIR_NATS_PASSWORD": str(login.password),
    }
    result = subprocess.run(
        [GFAIR, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, f"gfair {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout


def ended(states: dict[Job, JobState]) -> list[Job]:
    return [job for job, state in states.items() if state.terminal]


async def all_ended(
    client: GfairClient, jobs: set[Job], project: ComposeProject, timeout_s: float
) -> dict[Job, JobState]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            states = {(j.user, j.job_id): j.state for j in await client.jobs()}
        except (NoCluster, BusError):  # a broker is restarting, or the brokers electing
            states = {}
        if jobs <= set(ended(states)):
            return {j: states[j] for j in jobs}
        if time.monotonic() > deadline:
            left = {f"{u}/{i}": states.get((u, i)) for u, i in jobs - set(ended(states))}
            raise AssertionError(f"not ended in {timeout_s:.0f} s: {left}\n{project.logs(tail=40)}")
        await asyncio.sleep(1)


async def judge(client: GfairClient, jobs: set[Job]) -> None:
    """What the stream says: each job submitted once, started, ended once, and no GPU held
    by two jobs at a time."""
    events = await job_history(client.bus)
    outcomes = Outcomes.of(events)
    assert outcomes.problems(jobs) == []
    assert {job: outcomes.submitted[job] for job in jobs} == dict.fromkeys(jobs, 1)
    started = {(e.data.user, e.data.job_id) for e in events if isinstance(e.data, JobStarted)}
    assert jobs <= started, f"never started: {jobs - started}"
    assert all(isinstance(outcomes.end(job), JobCompleted) for job in jobs)
    overlaps, intervals = gpu_overlaps(events)
    assert overlaps == [], overlaps
    assert intervals >= len(jobs)


def submitted_jobs(events: Sequence[object]) -> set[Job]:
    return {(e.data.user, e.data.job_id) for e in events if isinstance(e.data, JobSubmitted)}  # type: ignore[attr-defined]


def test_the_image_holds_gfair_and_nothing_of_the_checkout(images: Images) -> None:
    image = images.variables["GFAIR_IMAGE"]
    # Every file of the image, from a container made (not run) of it.
    container = docker("create", image).strip()
    try:
        listing = subprocess.run(
            f"docker export {container} | tar -t",
            shell=True,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout.splitlines()
    finally:
        docker("rm", container)
    names = {Path(line).name for line in listing}
    assert "gfair" in names and "nats" in names  # the CLI, and nats-py in the venv
    # No secret, key, checkout or build leftover reached a layer: the context holds only
    # the package's source and wheels (.dockerignore), and the build stage is discarded.
    for leaked in (".env", "compose.env", ".git", ".venv", "wheels"):
        assert leaked not in names, leaked
    assert not [n for n in names if n.endswith(("-key.pem", ".key"))]
    # Wheels only where Debian's python3-venv keeps pip's own, none of the wheelhouse.
    assert not [p for p in listing if p.endswith(".whl") and "python-wheels/" not in p]
    history = docker("history", "--no-trunc", "--format", "{{.CreatedBy}}", image)
    assert "PASSWORD" not in history and "SECRET" not in history
    print(f"\ngfair image: {images.size_mb:.0f} MB, built in {images.build_s:.0f} s")


async def test_a_mixed_workload_survives_every_container_crashing_and_a_restart(
    compose_project: ProjectFactory,
) -> None:
    project = compose_project()
    started = time.monotonic()
    project.up(*DEPLOYMENT)
    operator = project.login("operator", "GFAIR_OPERATOR_PASSWORD")
    alice = project.login("alice", "GFAIR_TENANT_ALICE_PASSWORD")
    client = await connected(operator, project)
    async with client:
        # Started with the services, the executor waited for their streams: no restart.
        assert project.restarts(EXECUTOR) == 0, project.logs([EXECUTOR])
        idle = project.memory_mib()
        # From the host's CLI, as a tenant and as the operator (for another tenant).
        cli(project, alice, "submit", "--gpus", "1", "--job-id", "cli-a", "--", *synthetic(20))
        cli(
            project,
            operator,
            "submit",
            "--user",
            "bob",
            "--gpus",
            "2",
            "--job-id",
            "cli-b",
            "--",
            *synthetic(20),
        )
        jobs: set[Job] = {("alice", "cli-a"), ("bob", "cli-b")}
        for n, (user, gpus, seconds) in enumerate(
            [
                ("alice", 1, 25),
                ("alice", 1, 25),
                ("alice", 2, 20),
                ("alice", 1, 30),
                ("bob", 1, 25),
                ("bob", 1, 30),
                ("bob", 2, 20),
                ("bob", 1, 25),
            ]
        ):
            job_id = f"mix-{n}"
            await client.submit(user, gpus, synthetic(seconds), job_id=job_id)
            jobs.add((user, job_id))
        running = await client.submit(
            "alice", 1, synthetic(1), job_id="first", wait="running", timeout_s=120
        )
        jobs.add(("alice", "first"))
        to_first_job_s = time.monotonic() - started
        assert running.state is not None
        # Every kind of container, one at a time, while the jobs run and wait: the engine
        # restarts each (restart: unless-stopped) and the cluster carries on.
        for service in (*CONTROL_PLANE, EXECUTOR, "nats"):
            await asyncio.sleep(4)
            await asyncio.to_thread(project.crash, service)
        busy = project.memory_mib()
        states = await all_ended(client, jobs, project, timeout_s=420)
        assert set(states.values()) == {JobState.COMPLETED}, states
        await judge(client, jobs)
    restarts = {s: project.restarts(s) for s in (*CONTROL_PLANE, EXECUTOR, "nats")}
    assert all(n >= 1 for n in restarts.values()), restarts

    # Down and up again on the same volumes: the jobs are still there, and new ones run.
    project.down(volumes=False)
    project.up(*DEPLOYMENT)
    client = await connected(operator, project)
    async with client:
        before = {(j.user, j.job_id): j.state for j in await client.jobs()}
        assert {j: before.get(j) for j in jobs} == dict.fromkeys(jobs, JobState.COMPLETED)
        final = await client.submit(
            "bob", 1, synthetic(2), job_id="after-restart", wait="ended", timeout_s=180
        )
        assert final.state is JobState.COMPLETED
        jobs.add(("bob", "after-restart"))
        await judge(client, jobs)
        # The tenant reads her own jobs only, through the query service.
        mine = cli(project, alice, "jobs", "--json")
        assert "cli-a" in mine and "cli-b" not in mine
    print(
        f"\ncompose up to first job running: {to_first_job_s:.1f} s; memory MiB idle {idle}; "
        f"under the workload {busy}"
    )


async def test_three_brokers_carry_the_cluster_with_one_killed(
    compose_project: ProjectFactory,
) -> None:
    project = compose_project(files=(ROOT / "compose.yaml", HA_FILE))
    project.up("nats", "nats-2", "nats-3", *CONTROL_PLANE, EXECUTOR)
    # No standalone broker besides the three.
    names = {str(c["Service"]) for c in project.containers()}
    assert names == {"nats", "nats-2", "nats-3", *CONTROL_PLANE, EXECUTOR}
    ports = [
        project.variables[v] for v in ("GFAIR_NATS_PORT", "GFAIR_NATS_PORT_2", "GFAIR_NATS_PORT_3")
    ]
    password = project.variables["GFAIR_OPERATOR_PASSWORD"]
    # Tools on the host reach each broker, and the cluster through any of them.
    for port in ports:
        one = ConnectOptions(
            servers=(f"nats://127.0.0.1:{port}",), user="operator", password=password
        )
        async with await connected(one, project) as client:
            assert [n.node_id for n in await client.nodes()] == ["sim-1"]
    every = ConnectOptions(
        servers=tuple(f"nats://127.0.0.1:{p}" for p in ports), user="operator", password=password
    )
    client = await connected(every, project)
    async with client:
        jobs: set[Job] = set()
        for n in range(8):
            user = ("alice", "bob")[n % 2]
            await client.submit(user, 1 + n % 2, synthetic(15), job_id=f"ha-{n}")
            jobs.add((user, f"ha-{n}"))
        await asyncio.sleep(8)
        docker("kill", project.container_id("nats-2"))  # stays down: two of three go on
        states = await all_ended(client, jobs, project, timeout_s=300)
        assert set(states.values()) == {JobState.COMPLETED}, states
        await judge(client, jobs)
