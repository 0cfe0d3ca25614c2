"""Fixtures shared by every test area."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gfair.bus.server import EmbeddedNatsServer, NatsServerConfig
from gfair.core.scheduler import SplitStride


@pytest.fixture(autouse=True)
def own_state_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `gfair up` running on this machine must not become the cluster a test talks to.

    Tools look for its context file under ``$XDG_STATE_HOME`` (`gfair.client.cluster_context`).
    """
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture
def checked_machines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every split-stride machine the test makes rebuilds its index after every input and
    raises where the one it kept differs (`SplitStride(check=True)`)."""
    defaults = SplitStride.__init__.__kwdefaults__
    assert defaults is not None
    monkeypatch.setitem(defaults, "check", True)


@pytest.fixture
def tmp_path(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pytest's own, but passable (not listable) by other accounts when the tests run as root.

    A root executor runs every job as its tenant's unprivileged account
    (`gfair.node.job_account`), and refuses work and checkpoint roots those accounts cannot
    reach; pytest makes its folders 0700, and a pytest run inside a test closes its
    ``pytest-of-<user>`` folder again, so every test opens the whole chain.
    """
    if os.geteuid() == 0:
        base = tmp_path_factory.getbasetemp()
        for folder in (tmp_path, *tmp_path.relative_to(base).parents[:-1], base, base.parent):
            folder = folder if folder.is_absolute() else base / folder
            folder.chmod(stat.S_IMODE(folder.stat().st_mode) | 0o011)
    return tmp_path


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
