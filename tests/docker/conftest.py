"""The Docker engine, the local base images and the gfair image, once a session.

Without a reachable engine these tests skip and say why; where the engine is required
(`GFAIR_REQUIRE_DOCKER=1`, as `.ci/run` sets it after installing and starting one) that is a
failure instead, so CI never passes a compose suite that did not run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from .compose_project import ROOT, ComposeProject, docker, free_port, fresh_secrets

pytestmark = [pytest.mark.docker]

COMPOSE_FILE = ROOT / "compose.yaml"
REQUIRED = "GFAIR_REQUIRE_DOCKER"


def _engine_problem() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    result = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        return f"no Docker engine answers `docker info`: {result.stderr.strip()[:200]}"
    return None


def unavailable(reason: str) -> None:
    if os.environ.get(REQUIRED) == "1":
        pytest.fail(f"{REQUIRED}=1, but {reason}")
    pytest.skip(reason)


@dataclass(frozen=True)
class Images:
    """The images compose runs: the base stand-ins, and gfair's own with how it was built."""

    variables: Mapping[str, str]  # PYTHON_IMAGE, NATS_IMAGE, PROMETHEUS_IMAGE, GFAIR_IMAGE
    build_s: float
    size_mb: float


@pytest.fixture(scope="session")
def images() -> Images:
    problem = _engine_problem()
    if problem is not None:
        unavailable(problem)
    script = ROOT / "deploy" / "images" / "build-local.sh"
    env = dict(os.environ, PYTHON=str(Path(os.sys.executable)))
    made = subprocess.run(
        [str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    if made.returncode != 0:
        unavailable(f"the local base images could not be built:\n{made.stderr[-2000:]}")
    variables = dict(
        pair.split("=", 1) for pair in made.stdout.strip().removeprefix("export ").split()
    )
    tag = f"gfair:test-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    docker(
        "build",
        "--quiet",
        "-f",
        "deploy/Dockerfile",
        "--build-arg",
        f"PYTHON_IMAGE={variables['PYTHON_IMAGE']}",
        "-t",
        tag,
        str(ROOT),
        timeout_s=900,
    )
    build_s = time.monotonic() - started
    size = int(docker("image", "inspect", "-f", "{{.Size}}", tag).strip())
    return Images({**variables, "GFAIR_IMAGE": tag}, build_s, size / 1e6)


ProjectFactory = Callable[..., ComposeProject]


@pytest.fixture
def compose_project(
    images: Images, tmp_path: Path
) -> Iterator[ProjectFactory]:
    """Makes compose projects of fresh secrets, local images and free loopback ports; each is
    taken down with its volumes at the end of the test."""
    made: list[ComposeProject] = []

    def make(
        files: Sequence[Path] = (COMPOSE_FILE,),
        extra: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
    ) -> ComposeProject:
        variables = {
            **(fresh_secrets() if secrets is None else dict(secrets)),
            **images.variables,
            "GFAIR_NATS_BIND": "127.0.0.1",
            "GFAIR_UI_BIND": "127.0.0.1",
            "GFAIR_NATS_PORT": str(free_port()),
            "GFAIR_NATS_PORT_2": str(free_port()),
            "GFAIR_NATS_PORT_3": str(free_port()),
            "GFAIR_PROMETHEUS_PORT": str(free_port()),
            "GFAIR_JAEGER_PORT": str(free_port()),
            "GFAIR_GRAFANA_PORT": str(free_port()),
            # Quick slices, so a short workload still time-slices, suspends and migrates.
            "GFAIR_QUANTUM_S": "6",
            **(extra or {}),
        }
        name = f"gfair-t{uuid.uuid4().hex[:8]}"
        project = ComposeProject(name, list(files), variables, tmp_path / name)
        made.append(project)
        return project

    yield make
    for project in reversed(made):
        project.down(volumes=True)
