"""The entry point of a service process: `python -m gfair_services.<name>` calls `main`."""

from __future__ import annotations

import asyncio
import gc
from typing import Self

import structlog
from pydantic import Field, FilePath, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.observability import ObservabilitySettings, configure_observability
from gfair.bus.publisher import EVENT_ID_KEY_VARIABLE, event_ids_are_keyed
from gfair.bus.runner import DEFAULT_BATCH, RunnerSettings
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.service import Service


class BusSettings(BaseSettings):
    """Where the bus is and how to log in to it, from `GFAIR_*` environment variables.

    Credentials are one of `GFAIR_NATS_USER` (+ `GFAIR_NATS_PASSWORD`), `GFAIR_NATS_TOKEN`,
    `GFAIR_NATS_CREDS` or `GFAIR_NATS_NKEY_SEED`; `GFAIR_NATS_TLS_CA`, `GFAIR_NATS_TLS_CERT` and
    `GFAIR_NATS_TLS_KEY` (or a `tls://` URL) turn TLS on. Empty variables count as unset.
    """

    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore", env_ignore_empty=True)

    nats_url: str = Field(
        default="nats://127.0.0.1:4222", description="Comma-separated NATS server URLs"
    )
    nats_user: str | None = Field(default=None, description="NATS user name")
    nats_password: SecretStr | None = Field(default=None, description="Password of the NATS user")
    nats_token: SecretStr | None = Field(default=None, description="NATS authentication token")
    nats_creds: FilePath | None = Field(
        default=None, description="NATS .creds file: user JWT and NKey seed"
    )
    nats_nkey_seed: FilePath | None = Field(default=None, description="File holding an NKey seed")
    nats_tls_ca: FilePath | None = Field(
        default=None, description="CA certificate(s) to verify the NATS server with (PEM)"
    )
    nats_tls_cert: FilePath | None = Field(
        default=None, description="Client certificate for servers that verify clients (PEM)"
    )
    nats_tls_key: FilePath | None = Field(default=None, description="Key of the client certificate")
    nats_tls_hostname: str | None = Field(
        default=None, description="Name expected on the server certificate, if not the URL host"
    )
    nats_tls_first: bool = Field(
        default=False, description="TLS handshake before anything else (server: handshake_first)"
    )
    event_id_key: SecretStr | None = Field(
        default=None, description="Secret the services' and executors' event ids are keyed with"
    )
    nats_inbox_prefix: str | None = Field(
        default=None, description="Reply subject prefix; default _INBOX_<user> with a user"
    )
    fetch_batch: int = Field(
        default=DEFAULT_BATCH,
        ge=1,
        description="Events fetched, handled and settled (published, acknowledged) together",
    )
    fetch_timeout_s: float = Field(default=1.0, gt=0)

    @property
    def authenticates(self) -> bool:
        """Whether this process logs in: a cluster with logins separates tenants."""
        return any(
            value is not None
            for value in (self.nats_user, self.nats_token, self.nats_creds, self.nats_nkey_seed)
        )

    @property
    def servers(self) -> tuple[str, ...]:
        return tuple(url.strip() for url in self.nats_url.split(",") if url.strip())

    @model_validator(mode="after")
    def _options_are_consistent(self) -> Self:
        self.nats_options()  # the same rules, reported as a validation error at startup
        return self

    @model_validator(mode="after")
    def _no_placeholder_secrets(self) -> Self:
        # A deployment's sample secrets are public: a service must not start with one.
        for variable, secret, shortest in (
            ("GFAIR_NATS_PASSWORD", self.nats_password, 1),
            ("GFAIR_NATS_TOKEN", self.nats_token, 1),
            (EVENT_ID_KEY_VARIABLE, self.event_id_key, EVENT_ID_KEY_LENGTH),
        ):
            text = _reveal(secret)
            if text is not None and (text.startswith(PLACEHOLDER) or len(text) < shortest):
                raise ValueError(
                    f"{variable} is a placeholder or shorter than {shortest} characters: set a "
                    "secret of your own (e.g. `openssl rand -hex 32`; docs/deployment.md)"
                )
        return self

    def nats_options(self, name: str | None = None) -> NatsOptions:
        """The connection options these settings describe, for a client called `name`."""

        def text(path: object | None) -> str | None:
            return None if path is None else str(path)

        return NatsOptions(
            servers=self.servers,
            name=name,
            user=self.nats_user,
            password=_reveal(self.nats_password),
            token=_reveal(self.nats_token),
            user_credentials=text(self.nats_creds),
            nkeys_seed=text(self.nats_nkey_seed),
            tls_ca_file=text(self.nats_tls_ca),
            tls_cert_file=text(self.nats_tls_cert),
            tls_key_file=text(self.nats_tls_key),
            tls_hostname=self.nats_tls_hostname,
            tls_handshake_first=self.nats_tls_first,
            inbox_prefix=self.nats_inbox_prefix,
        )


# What the deployment's samples start their secrets with.
PLACEHOLDER = "change-me"
# The shortest event-id key taken: 16 bytes, hex-encoded (`openssl rand -hex 32` gives 64).
EVENT_ID_KEY_LENGTH = 32


def _reveal(secret: SecretStr | None) -> str | None:
    return None if secret is None else secret.get_secret_value()


# Young-generation collections every this many allocations (Python's default: 700). A service
# allocates a few hundred objects per event and keeps its state for long: collecting less often
# saves about a sixth of the CPU an event costs, for a little more garbage held in between.
GC_YOUNG_THRESHOLD = 20_000


async def _freeze_state(runtime: ServiceRuntime) -> None:
    """Once start-up rebuilt the service's state, leave it out of every later collection.

    Scanning thousands of long-lived records on each full collection is work that never frees
    anything; what start-up left as garbage is collected first.
    """
    del runtime
    gc.collect()
    gc.freeze()


async def serve(
    service: Service,
    bus_settings: BusSettings | None = None,
    observability_settings: ObservabilitySettings | None = None,
) -> None:
    """Run `service` against NATS until SIGTERM/SIGINT, then drain and flush telemetry."""
    bus_settings = bus_settings or BusSettings()
    observability = configure_observability(service.name, observability_settings)
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
    service.on_start(_freeze_state)  # after the service's own hooks: they run in order
    if bus_settings.authenticates and not event_ids_are_keyed():
        structlog.get_logger("gfair.bus").warning(
            "event ids are not keyed: a tenant can predict them and have this service's "
            "events dropped as duplicates",
            fix=f"give every service and executor the same secret in ${EVENT_ID_KEY_VARIABLE}",
        )
    try:
        bus = await NatsBus.connect(bus_settings.nats_options(name=service.name))
        try:
            runtime = ServiceRuntime(
                service,
                bus,
                tracer=observability.tracer,
                settings=RunnerSettings(
                    batch=bus_settings.fetch_batch, fetch_timeout_s=bus_settings.fetch_timeout_s
                ),
            )
            await runtime.run(handle_signals=True)
        finally:
            await bus.close()
    finally:
        observability.shutdown()


def main(service: Service) -> None:
    asyncio.run(serve(service))
