"""A real nats-server running the shipped `deploy/nats/nats.conf` and `auth.conf`.

The two files are copied as they are; only what belongs to the machine changes: the store
directory (the test's own) and the monitoring port (none). The client port comes from the
command line, which overrides `listen`. What is tested is the shipped authorization.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.server import EmbeddedNatsServer, NatsServerConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED = REPO_ROOT / "deploy" / "nats"

SERVICES_USER = "gfair-services"
PASSWORDS = {
    SERVICES_USER: "services-secret-1f3a",
    "operator": "operator-secret-77c2",
    "gfair-query": "query-secret-3c85",
    "alice": "alice-secret-0b9e",
    "bob": "bob-secret-d41c",
    "node-sim-1": "node-sim-1-secret-5e02",
    "node-gpu-1": "node-gpu-1-secret-a7d9",
}
SERVER_ENV = {
    "GFAIR_NATS_SERVER_NAME": "tenancy-test",
    "GFAIR_SERVICES_USER": SERVICES_USER,
    "GFAIR_SERVICES_PASSWORD": PASSWORDS[SERVICES_USER],
    "GFAIR_OPERATOR_PASSWORD": PASSWORDS["operator"],
    "GFAIR_QUERY_SERVICE_PASSWORD": PASSWORDS["gfair-query"],
    "GFAIR_TENANT_ALICE_PASSWORD": PASSWORDS["alice"],
    "GFAIR_TENANT_BOB_PASSWORD": PASSWORDS["bob"],
    "GFAIR_NODE_SIM_1_PASSWORD": PASSWORDS["node-sim-1"],
    "GFAIR_NODE_GPU_1_PASSWORD": PASSWORDS["node-gpu-1"],
}


def replace_line(text: str, starts_with: str, replacement: str | None) -> str:
    """Replace (or drop) the one line of `text` that starts with `starts_with`, stripped."""
    lines = text.splitlines()
    hits = [i for i, line in enumerate(lines) if line.strip().startswith(starts_with)]
    assert len(hits) == 1, f"expected one {starts_with!r} line in the shipped nats.conf"
    if replacement is None:
        del lines[hits[0]]
    else:
        lines[hits[0]] = replacement
    return "\n".join(lines) + "\n"


def shipped_config(directory: Path, *, edit: str = "") -> Path:
    """Copy the shipped configuration into `directory`, fitted to a test machine."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(SHIPPED / "auth.conf", directory / "auth.conf")
    text = (SHIPPED / "nats.conf").read_text()
    # The command line gives the store (`-sd`); the server refuses a second one.
    text = replace_line(text, "store_dir:", None)
    text = replace_line(text, "http:", None)
    path = directory / "nats.conf"
    path.write_text(text + edit)
    return path


@pytest.fixture
def server_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables the shipped configuration reads; the server inherits them."""
    for name, value in SERVER_ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def shipped_server(tmp_path: Path, server_env: None) -> Iterator[EmbeddedNatsServer]:
    config = shipped_config(tmp_path / "conf")
    server = EmbeddedNatsServer(NatsServerConfig(store_dir=tmp_path / "store", config_file=config))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Connection:
    """A plain nats-py connection that keeps every error the server reports to it."""

    nc: NatsClient
    errors: list[str] = field(default_factory=list)

    async def on_error(self, exc: Exception) -> None:
        self.errors.append(str(exc))

    def _take_violations(self) -> list[str]:
        found = [e for e in self.errors if "permissions violation" in e.lower()]
        self.errors[:] = [e for e in self.errors if e not in found]
        return found

    async def refusal(self, timeout_s: float = 2.0) -> str:
        """The next permissions violation the server reports; fails if none comes.

        The server answers a forbidden publish or subscribe with an -ERR and drops it; for a
        subscription the -ERR may come after the reply to a flush, so this waits for it.
        """
        deadline = asyncio.get_running_loop().time() + timeout_s
        await self.nc.flush(timeout=2)
        while True:
            found = self._take_violations()
            if found:
                assert len(found) == 1, found
                return found[0]
            assert asyncio.get_running_loop().time() < deadline, "no permissions violation"
            await asyncio.sleep(0.01)

    async def violations(self, settle_s: float = 0.2) -> list[str]:
        """Every permissions violation reported by now, after a short wait for late ones."""
        await self.nc.flush(timeout=2)
        await asyncio.sleep(settle_s)
        return self._take_violations()


def options_for(url: str, user: str, **overrides: object) -> NatsOptions:
    settings: dict[str, object] = {
        "servers": (url,),
        "name": f"test-{user}",
        "user": user,
        "password": PASSWORDS[user],
        "initial_connect_deadline_s": 5.0,
        "api_timeout_s": 2.0,
        "publish_attempt_timeout_s": 1.0,
        "publish_deadline_s": 3.0,
    } | overrides
    return NatsOptions(**settings)  # type: ignore[arg-type]


@dataclass
class Logins:
    """Connections to one server as the shipped users; all closed at the end."""

    url: str
    buses: list[NatsBus] = field(default_factory=list)
    connections: list[Connection] = field(default_factory=list)

    async def bus(self, user: str, **overrides: object) -> NatsBus:
        bus = await NatsBus.connect(options_for(self.url, user, **overrides))
        self.buses.append(bus)
        return bus

    async def connection(self, user: str) -> Connection:
        """Logged in with the same options a bus uses (credentials, inbox prefix)."""
        options = options_for(self.url, user)
        connection = Connection(NatsClient())
        await connection.nc.connect(
            servers=list(options.servers),
            max_reconnect_attempts=0,
            error_cb=connection.on_error,
            **options.auth_kwargs(),
        )
        self.connections.append(connection)
        return connection

    async def close(self) -> None:
        for bus in self.buses:
            await bus.close()
        for connection in self.connections:
            await connection.nc.close()


@pytest.fixture
async def logins(shipped_server: EmbeddedNatsServer) -> AsyncIterator[Logins]:
    logins = Logins(shipped_server.url)
    try:
        yield logins
    finally:
        await logins.close()
