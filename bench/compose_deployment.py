"""A compose project in a real Docker engine, as the tests (tests/docker) and `bench.compose`
start, crash and stop it, and the images it runs.

Each project has its own name, secrets, published ports (on 127.0.0.1 only, chosen free) and
volumes, so several can run side by side in one engine: a control plane and the GPU servers
that join it, or two test modules. The images are the local stand-ins of
`deploy/images/build-local.sh` (no registry is reachable from CI) and the gfair image built
from `deploy/Dockerfile` (`build_images`).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gfair.client import ConnectOptions, GfairClient, NoCluster

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = str(Path(sys.executable).parent / "docker-compose")
COMPOSE_FILE = ROOT / "compose.yaml"
SECRETS_TEMPLATE = ROOT / "deploy" / "compose.env.example"
# The host ports compose.yaml and deploy/compose.ha.yaml publish, each a variable.
PORTS = (
    "GFAIR_NATS_PORT",
    "GFAIR_NATS_PORT_2",
    "GFAIR_NATS_PORT_3",
    "GFAIR_PROMETHEUS_PORT",
    "GFAIR_JAEGER_PORT",
    "GFAIR_GRAFANA_PORT",
)
# The control plane's gfair containers, as compose.yaml names them.
CONTROL_PLANE = (
    "profiler",
    "placement",
    "split-stride",
    "trading-auction",
    "failure-detector",
    "query",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def fresh_secrets() -> dict[str, str]:
    """A secret for each variable of the template, as an operator makes them."""
    lines = SECRETS_TEMPLATE.read_text().splitlines()
    names = [line[:-1] for line in lines if line.endswith("=") and not line.startswith("#")]
    return {name: secrets.token_hex(32) for name in names}


@dataclass(frozen=True)
class Images:
    """The images compose runs: the base stand-ins, and gfair's own with how it was built."""

    variables: dict[str, str]  # PYTHON_IMAGE, NATS_IMAGE, PROMETHEUS_IMAGE, GFAIR_IMAGE
    build_s: float
    size_mb: float


class ImagesUnavailable(Exception):
    """The local base images could not be made (no debootstrap, not root, no network...)."""


def build_images(*, no_cache: bool = False) -> Images:
    """The local base images (deploy/images/build-local.sh, cached in the engine) and a
    freshly tagged gfair image built from deploy/Dockerfile on them."""
    env = dict(os.environ, PYTHON=sys.executable)
    made = subprocess.run(
        [str(ROOT / "deploy" / "images" / "build-local.sh")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if made.returncode != 0:
        raise ImagesUnavailable(made.stderr[-2000:])
    exported = made.stdout.strip().removeprefix("export ").split()
    variables = dict(pair.split("=", 1) for pair in exported)
    tag = f"gfair:test-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    build = ["build", "--quiet", "-f", "deploy/Dockerfile", "-t", tag]
    build += ["--build-arg", f"PYTHON_IMAGE={variables['PYTHON_IMAGE']}"]
    docker(*build, *(["--no-cache"] if no_cache else []), str(ROOT), timeout_s=900)
    build_s = time.monotonic() - started
    size = int(docker("image", "inspect", "-f", "{{.Size}}", tag).strip())
    return Images({**variables, "GFAIR_IMAGE": tag}, build_s, size / 1e6)


def project_variables(images: Images, secrets: Mapping[str, str] | None = None) -> dict[str, str]:
    """A project's variables: its secrets (fresh ones if not given), the images, and every
    port free on 127.0.0.1."""
    return {
        **(fresh_secrets() if secrets is None else secrets),
        **images.variables,
        "GFAIR_NATS_BIND": "127.0.0.1",
        "GFAIR_UI_BIND": "127.0.0.1",
        **{variable: str(free_port()) for variable in PORTS},
    }


def new_project(
    images: Images,
    workdir: Path,
    files: Sequence[Path] = (),
    secrets: Mapping[str, str] | None = None,
    **extra: str,
) -> ComposeProject:
    """A project of its own name, `project_variables` and `extra`, files in `workdir`."""
    name = f"gfair-t{uuid.uuid4().hex[:8]}"
    variables = {**project_variables(images, secrets), **extra}
    return ComposeProject(name, list(files) or [COMPOSE_FILE], variables, workdir / name)


def docker(*args: str, timeout_s: float = 120, check: bool = True) -> str:
    result = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout


@dataclass
class ComposeProject:
    """One `docker compose -p <name>` project: its files, its variables and its env file."""

    name: str
    files: Sequence[Path]
    variables: dict[str, str]
    workdir: Path
    started: list[str] = field(default_factory=list)

    @property
    def env_file(self) -> Path:
        return self.workdir / f"{self.name}.env"

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.env_file.write_text("".join(f"{k}={v}\n" for k, v in self.variables.items()))

    def compose(self, *args: str, timeout_s: float = 300, check: bool = True) -> str:
        # Only the project's own variables: none of the operator's shell (GFAIR_NATS_URL of
        # the CLI on this host, say) reaches the services.
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
        files = [arg for path in self.files for arg in ("-f", str(path))]
        # Relative paths from the first file's folder, as compose resolves them by itself:
        # deploy/gpu-server/compose.yaml's are its own, compose.yaml's the repository's.
        directory = Path(self.files[0]).resolve().parent
        command = [COMPOSE, "-p", self.name, "--project-directory", str(directory)]
        command += ["--env-file", str(self.env_file), *files, *args]
        result = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
        )
        # The docker-compose wrapper may drop compose's exit status; its error still shows.
        failed = result.returncode != 0 or "Error response from daemon" in result.stderr
        if check and failed:
            raise AssertionError(f"docker compose {' '.join(args)} failed:\n{result.stderr}")
        return result.stdout

    def up(self, *services: str, timeout_s: float = 300) -> None:
        self.compose("up", "-d", "--no-build", "--wait", *services, timeout_s=timeout_s)
        self.started += [s for s in services if s not in self.started]

    def down(self, *, volumes: bool) -> None:
        self.compose("down", *(["--volumes"] if volumes else []), "--timeout", "20")

    def containers(self, service: str | None = None) -> list[dict[str, object]]:
        out = self.compose("ps", "--all", "--format", "json", *([service] if service else []))
        # One JSON object per line (compose v2), or one array (older releases).
        text = out.strip()
        if not text:
            return []
        if text.startswith("["):
            found: list[dict[str, object]] = json.loads(text)
            return found
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def container_id(self, service: str) -> str:
        (only,) = [str(c["ID"]) for c in self.containers(service)]
        return only

    def crash(self, service: str) -> None:
        """SIGKILL the container's first process from the host, as a crash would: the engine
        restarts it (`restart: unless-stopped`), unlike after `docker kill`, which counts as
        stopped by hand."""
        pid = int(docker("inspect", "-f", "{{.State.Pid}}", self.container_id(service)).strip())
        before = self.restarts(service)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while self.restarts(service) == before or not self.running(service):
            assert time.monotonic() < deadline, f"{service} was not restarted after its crash"
            time.sleep(0.5)

    def restarts(self, service: str) -> int:
        out = docker("inspect", "-f", "{{.RestartCount}}", self.container_id(service))
        return int(out.strip())

    def running(self, service: str) -> bool:
        out = docker("inspect", "-f", "{{.State.Running}}", self.container_id(service))
        return out.strip() == "true"

    def logs(self, services: Iterable[str] = (), tail: int = 30) -> str:
        return self.compose("logs", "--no-color", "--tail", str(tail), *services, check=False)

    def memory_mib(self) -> dict[str, float]:
        """Each running container's memory, as `docker stats` reads it from its cgroup."""
        ids = [str(c["ID"]) for c in self.containers() if c.get("State") == "running"]
        out = docker("stats", "--no-stream", "--format", "{{json .}}", *ids)
        found = {}
        for line in out.splitlines():
            row = json.loads(line)
            used = row["MemUsage"].split("/")[0].strip()
            found[row["Name"]] = _mib(used)
        return found

    def login(
        self, user: str, password_variable: str, port_variable: str = "GFAIR_NATS_PORT"
    ) -> ConnectOptions:
        """How a tool on the host logs in, through the published broker port."""
        return ConnectOptions(
            servers=(f"nats://127.0.0.1:{self.variables[port_variable]}",),
            user=user,
            password=self.variables[password_variable],
        )


def _mib(text: str) -> float:
    units = {
        "B": 1 / 2**20,
        "KiB": 1 / 2**10,
        "MiB": 1.0,
        "GiB": 2**10,
        "kB": 1e3 / 2**20,
        "MB": 1e6 / 2**20,
        "GB": 1e9 / 2**20,
    }
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * units[unit]
    raise ValueError(f"not a memory size: {text}")


# The synthetic training job in the gfair image's own environment; its flags follow.
SYNTHETIC_JOB = ["/opt/gfair/bin/python", "-m", "gfair.sdk.synthetic"]
SYNTHETIC_JOB_TYPE = "ResNet-50 (batch size 32)"


def synthetic(seconds: float) -> list[str]:
    """The synthetic job: `seconds` of work on a V100."""
    return [*SYNTHETIC_JOB, "--job-type", SYNTHETIC_JOB_TYPE, "--duration-s", str(seconds)]


async def connected(
    login: ConnectOptions, project: ComposeProject, nodes: Collection[str] = ()
) -> GfairClient:
    """A client once `nodes` (else any node) have registered: the services are up."""
    deadline = time.monotonic() + 120
    client = await GfairClient.connect(options=login, poll_interval_s=0.2)
    while True:
        try:
            registered = {node.node_id for node in await client.nodes()}
        except NoCluster:  # the services have not declared their buckets yet
            registered = set()
        if registered and registered >= set(nodes):
            return client
        if time.monotonic() > deadline:
            await client.close()
            raise AssertionError(f"nodes registered in 120 s: {registered}\n{project.logs()}")
        await asyncio.sleep(0.5)
