"""TLS as `deploy/nats/nats.conf` documents it, with a throw-away CA made by the test.

The server runs the shipped configuration with its commented `tls` block switched on (only the
certificate directory changed); clients configure TLS through `GFAIR_NATS_TLS_*`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gfair.bus.nats_bus import NatsBus
from gfair.bus.serve import BusSettings
from gfair.bus.server import EmbeddedNatsServer, NatsServerConfig
from gfair.bus.transport import BusError

from .conftest import PASSWORDS, SERVICES_USER, SHIPPED, shipped_config

pytestmark = pytest.mark.nats

OPENSSL = shutil.which("openssl")
SHIPPED_CERT_DIR = "/etc/nats/tls/"


@dataclass(frozen=True)
class Certificates:
    directory: Path
    ca: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def openssl(directory: Path, *args: str) -> None:
    assert OPENSSL is not None
    done = subprocess.run(
        [OPENSSL, *args], cwd=directory, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"openssl {' '.join(args)}: {done.stderr}"


def issue(directory: Path, name: str, subject: str, extensions: str) -> None:
    """A P-256 key and a certificate for it signed by the CA in `directory`."""
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    files = ["-keyout", f"{name}-key.pem", "-out", f"{name}.csr"]
    openssl(directory, "req", *key, "-subj", subject, *files)
    (directory / f"{name}.ext").write_text(extensions)
    openssl(
        directory,
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca-key.pem",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
        "-out",
        f"{name}.pem",
    )


def make_ca(directory: Path, stem: str) -> None:
    openssl(
        directory,
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "2",
        "-subj",
        f"/CN={stem}",
        "-keyout",
        f"{stem}-key.pem",
        "-out",
        f"{stem}.pem",
    )


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    if OPENSSL is None:
        pytest.skip("the openssl command is needed to make test certificates; it is not on PATH")
    directory = tmp_path_factory.mktemp("tls")
    make_ca(directory, "ca")
    make_ca(directory, "other-ca")
    # The names the shipped block expects: server.pem, server-key.pem, ca.pem.
    issue(
        directory,
        "server",
        "/CN=nats",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    issue(directory, "client", "/CN=gfair-client", "extendedKeyUsage=clientAuth\n")
    return Certificates(
        directory=directory,
        ca=directory / "ca.pem",
        client_cert=directory / "client.pem",
        client_key=directory / "client-key.pem",
        other_ca=directory / "other-ca.pem",
    )


def with_shipped_tls_block(directory: Path, certs: Path, *, handshake_first: bool) -> Path:
    """The shipped config with its TLS block uncommented, pointing at the test's certificates."""
    config = shipped_config(directory)
    lines = []
    inside = False
    for line in config.read_text().splitlines():
        if line.startswith("# tls {"):
            inside = True
        if inside:
            line = line.removeprefix("# ")
            if line.strip() == "# handshake_first: true":
                line = "  handshake_first: true" if handshake_first else ""
            line = line.replace(SHIPPED_CERT_DIR, f"{certs}/")
            if line == "}":
                inside = False
        lines.append(line)
    text = "\n".join(lines) + "\n"
    assert "tls {" in text and SHIPPED_CERT_DIR not in text, "the shipped TLS block changed"
    config.write_text(text)
    return config


@pytest.fixture(params=[False, True], ids=["starttls", "handshake-first"])
def tls_server(
    request: pytest.FixtureRequest, tmp_path: Path, server_env: None, certificates: Certificates
) -> Iterator[tuple[EmbeddedNatsServer, bool]]:
    handshake_first: bool = request.param
    config = with_shipped_tls_block(
        tmp_path / "conf", certificates.directory, handshake_first=handshake_first
    )
    server = EmbeddedNatsServer(NatsServerConfig(store_dir=tmp_path / "store", config_file=config))
    server.start()
    try:
        yield server, handshake_first
    finally:
        server.stop()


def login_environment(
    monkeypatch: pytest.MonkeyPatch, url: str, certs: Certificates, *, tls_first: bool
) -> None:
    monkeypatch.setenv("GFAIR_NATS_URL", url)
    monkeypatch.setenv("GFAIR_NATS_USER", SERVICES_USER)
    monkeypatch.setenv("GFAIR_NATS_PASSWORD", PASSWORDS[SERVICES_USER])
    monkeypatch.setenv("GFAIR_NATS_TLS_CA", str(certs.ca))
    monkeypatch.setenv("GFAIR_NATS_TLS_CERT", str(certs.client_cert))
    monkeypatch.setenv("GFAIR_NATS_TLS_KEY", str(certs.client_key))
    monkeypatch.setenv("GFAIR_NATS_TLS_FIRST", "1" if tls_first else "0")


async def connect(initial_connect_deadline_s: float = 3.0) -> NatsBus:
    """A bus configured the way a service is: `BusSettings` from the environment."""
    options = BusSettings().nats_options(name="tls-test")
    return await NatsBus.connect(
        dataclasses.replace(options, initial_connect_deadline_s=initial_connect_deadline_s)
    )


async def test_a_client_configured_from_the_environment_talks_tls(
    tls_server: tuple[EmbeddedNatsServer, bool],
    certificates: Certificates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, handshake_first = tls_server
    login_environment(
        monkeypatch, f"tls://localhost:{server.port}", certificates, tls_first=handshake_first
    )
    bus = await connect()
    try:
        reply = await bus.client.request("$JS.API.INFO", b"", timeout=2.0)
        assert b"memory" in reply.data  # JetStream answered over the encrypted link
    finally:
        await bus.close()


async def test_a_client_without_its_certificate_is_refused(
    tls_server: tuple[EmbeddedNatsServer, bool],
    certificates: Certificates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, handshake_first = tls_server
    login_environment(
        monkeypatch, f"tls://localhost:{server.port}", certificates, tls_first=handshake_first
    )
    monkeypatch.delenv("GFAIR_NATS_TLS_CERT")
    monkeypatch.delenv("GFAIR_NATS_TLS_KEY")
    with pytest.raises(BusError, match="certificate required"):
        # Refused outright, not retried until the 30 s deadline.
        await asyncio.wait_for(connect(initial_connect_deadline_s=30.0), 10.0)


async def test_a_server_signed_by_another_ca_is_refused_at_once(
    tls_server: tuple[EmbeddedNatsServer, bool],
    certificates: Certificates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, handshake_first = tls_server
    login_environment(
        monkeypatch, f"tls://localhost:{server.port}", certificates, tls_first=handshake_first
    )
    monkeypatch.setenv("GFAIR_NATS_TLS_CA", str(certificates.other_ca))
    with pytest.raises(BusError, match="TLS handshake failed"):
        # Refused outright, not retried until the 30 s deadline.
        await asyncio.wait_for(connect(initial_connect_deadline_s=30.0), 10.0)


async def test_asking_for_tls_from_a_plaintext_server_is_refused(
    shipped_server: EmbeddedNatsServer,
    certificates: Certificates,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    login_environment(
        monkeypatch, f"tls://localhost:{shipped_server.port}", certificates, tls_first=False
    )
    with pytest.raises(BusError, match="refusing to go on in plaintext"):
        await connect()


def test_the_shipped_tls_block_is_there_to_switch_on() -> None:
    text = (SHIPPED / "nats.conf").read_text()
    assert "# tls {" in text and "#   verify: true" in text
