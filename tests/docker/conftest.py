"""The Docker engine and the images, once a session, and compose projects for each test.

Without a reachable engine these tests skip and say why; where the engine is required
(`GFAIR_REQUIRE_DOCKER=1`, as `.ci/run` sets it after installing and starting one) that is a
failure instead, so CI never passes a compose suite that did not run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from bench.compose_deployment import (
    ComposeProject,
    Images,
    ImagesUnavailable,
    build_images,
    new_project,
)

REQUIRED = "GFAIR_REQUIRE_DOCKER"


def unavailable(reason: str) -> None:
    if os.environ.get(REQUIRED) == "1":
        pytest.fail(f"{REQUIRED}=1, but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def images() -> Images:
    if shutil.which("docker") is None:
        unavailable("no docker CLI on PATH")
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        unavailable(f"no Docker engine answers `docker info`: {info.stderr.strip()[:200]}")
    try:
        return build_images()
    except ImagesUnavailable as exc:
        unavailable(f"the local base images could not be built:\n{exc}")
        raise


EXAMPLE_IMAGE = "gfair-example/pytorch:cpu"


@pytest.fixture(scope="session")
def example_image(images: Images) -> str:
    """The example job image (examples/images/pytorch: CPU torch and examples/pytorch_train.py),
    built once from the local base when the engine does not have it (a few minutes)."""
    inspect = ["docker", "image", "inspect", EXAMPLE_IMAGE]
    if subprocess.run(inspect, capture_output=True, check=False).returncode:
        build = Path(__file__).parents[2] / "examples" / "images" / "pytorch" / "build.sh"
        env = {**os.environ, "BASE": images.variables["PYTHON_IMAGE"]}  # torch as build.sh pins it
        subprocess.run([str(build), EXAMPLE_IMAGE], check=True, env=env, timeout=900)
    return EXAMPLE_IMAGE


ProjectFactory = Callable[..., ComposeProject]


@pytest.fixture
def compose_project(images: Images, tmp_path: Path) -> Iterator[ProjectFactory]:
    """Makes compose projects (`new_project`), with quick slices so a short workload still
    time-slices, suspends and migrates; each is taken down with its volumes after the test."""
    made: list[ComposeProject] = []

    def make(
        files: Sequence[Path] = (),
        extra: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
    ) -> ComposeProject:
        variables = {"GFAIR_QUANTUM_S": "6", **(extra or {})}
        project = new_project(images, tmp_path, files, secrets, **variables)
        made.append(project)
        return project

    yield make
    for project in reversed(made):
        project.down(volumes=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Marked here once, for `pytest -m docker` (make compose-test); a conftest's pytestmark
    # would not apply to the tests.
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.docker)
