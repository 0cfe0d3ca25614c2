"""Fixtures shared by every test area."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gfair.bus.server import EmbeddedNatsServer, NatsServerConfig


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    """A real `nats-server -js` on a free port with its own store; stopped after the test.

    `restart()` keeps port and store, to test reconnects and durability.
    """
    server = EmbeddedNatsServer(NatsServerConfig(store_dir=tmp_path / "nats"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: EmbeddedNatsServer) -> str:
    return nats_server.url
