"""Connecting a tool to the cluster's NATS, with whatever credentials and TLS it needs.

A tool fails fast when nobody answers (a service waits for its server; a user at a terminal
wants to know now), and otherwise rides out reconnects like the services do.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import nats.errors
from nats.aio.client import Client as NatsClient

from gfair.bus.nats_bus import NatsBus, NatsOptions, inbox_prefix_for
from gfair.bus.serve import BusSettings
from gfair.client.cluster_context import (
    DEFAULT_NATS_URL,
    NATS_URL_ENV,
    ClusterAddress,
    locate_cluster,
    split_servers,
)
from gfair.client.errors import NotReachable
from gfair.cluster_logins import SERVICES_USER
from gfair.tenancy import NODE_USER_PREFIX, OPERATOR_USER, QUERY_USER, SERVICES_USER_VARIABLE

__all__ = [
    "DEFAULT_NATS_URL",
    "NATS_URL_ENV",
    "ConnectOptions",
    "connect_bus",
    "default_servers",
    "split_servers",
]

# The keyword arguments of `nats.connect` that log a client in.
_CREDENTIALS = ("user_credentials", "nkeys_seed", "token", "user", "password")


def default_servers() -> tuple[str, ...]:
    """`GFAIR_NATS_URL`, else a running `gfair up`'s context, else the local default."""
    return locate_cluster().servers


@dataclass(frozen=True)
class ConnectOptions:
    # Empty: found as `locate_cluster` says ($GFAIR_NATS_URL, a running `gfair up`, the default).
    servers: tuple[str, ...] = ()
    name: str = "gfair-client"
    connect_timeout_s: float = 2.0
    # nats-py also spends these on the first connection: a few, so that a tool whose server is
    # down says so within a second instead of retrying for long.
    max_reconnect_attempts: int = 3
    reconnect_wait_s: float = 0.25
    # Credentials, as nats-py takes them: a .creds file (JWT + NKey), an NKey seed file, a
    # token, or user and password.
    user_credentials: str | None = None
    nkeys_seed: str | None = None
    token: str | None = None
    user: str | None = None
    password: str | None = None
    tls: ssl.SSLContext | None = None
    tls_hostname: str | None = None
    # Anything else `nats.connect` takes, passed through as is.
    extra: Mapping[str, Any] = field(default_factory=dict)
    # How reads are made: straight from the services' records and streams, or by asking the
    # query service as a tenant must (`gfair.client.state_access`). "auto": a tenant's login
    # (a user that is not the operator, the services or a node executor) asks.
    reads: Literal["auto", "direct", "query"] = "auto"
    # Where `servers` came from; not an argument: `dataclasses.replace` with other servers must
    # not keep the credentials of a context they no longer come from.
    address: ClusterAddress = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if self.servers:
            address = ClusterAddress(split_servers(self.servers), "the given URL")
        else:
            address = locate_cluster()
        object.__setattr__(self, "servers", address.servers)
        object.__setattr__(self, "address", address)

    def connect_kwargs(self) -> dict[str, Any]:
        """Credentials and TLS: those given here, else the `GFAIR_NATS_*` ones services use."""
        from_environment = BusSettings().nats_options(name=self.name).auth_kwargs()
        given = {
            "user_credentials": self.user_credentials,
            "nkeys_seed": self.nkeys_seed,
            "token": self.token,
            "user": self.user,
            "password": self.password,
            "tls": self.tls,
            "tls_hostname": self.tls_hostname,
        }
        explicit = {key: value for key, value in given.items() if value is not None}
        logged_in = any(key in from_environment or key in explicit for key in _CREDENTIALS)
        if self.address.creds is not None and not logged_in:
            # The cluster was found through `gfair up`'s context, which says how to log in.
            explicit["user_credentials"] = self.address.creds
        if self.user is not None:
            # A tenant may only read replies on its own inbox (deploy/nats/auth.conf).
            explicit["inbox_prefix"] = inbox_prefix_for(self.user)
        return from_environment | explicit | dict(self.extra)

    def tenant(self) -> str | None:
        """The tenant whose reads go through the query service, or None to read directly."""
        user = self.connect_kwargs().get("user")
        if self.reads == "direct" or (self.reads == "auto" and not isinstance(user, str)):
            return None
        if not isinstance(user, str):
            raise ValueError("reads='query' needs a user login (the tenant the service answers)")
        if self.reads == "auto" and tenant_login(user) is None:
            return None
        return user


def tenant_login(user: str) -> str | None:
    """The tenant a NATS login is, or None for the operator's, the services' and nodes'."""
    services = os.environ.get(SERVICES_USER_VARIABLE) or SERVICES_USER
    if user in {OPERATOR_USER, QUERY_USER, services} or user.startswith(NODE_USER_PREFIX):
        return None
    return user


async def connect_bus(options: ConnectOptions) -> NatsBus:
    """A `NatsBus` for a tool; `NotReachable` when no server answers within the timeout."""

    refused: list[Exception] = []

    async def quiet(exc: Exception) -> None:
        # nats-py prints every connection error by default; the caller reports the outcome,
        # which for a refused login is not "unreachable".
        if "authorization violation" in str(exc).lower():
            refused.append(exc)

    client = NatsClient()
    try:
        await client.connect(
            servers=list(options.servers),
            name=options.name,
            connect_timeout=options.connect_timeout_s,  # type: ignore[arg-type]
            reconnect_time_wait=options.reconnect_wait_s,  # type: ignore[arg-type]
            max_reconnect_attempts=options.max_reconnect_attempts,
            error_cb=quiet,
            **options.connect_kwargs(),
        )
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        if refused:
            user = options.connect_kwargs().get("user")
            who = f"user {user!r}" if user else "no login"
            raise NotReachable(
                f"NATS at {', '.join(options.servers)} refused the login ({who}): "
                "authorization violation. Set GFAIR_NATS_USER and GFAIR_NATS_PASSWORD "
                "(`gfair up --auth` prints them)."
            ) from exc
        detail = str(exc) or type(exc).__name__
        raise NotReachable(
            f"cannot reach NATS at {', '.join(options.servers)}, from "
            f"{options.address.source} ({detail}); is the cluster up (`gfair up`)? "
            f"Set --nats or {NATS_URL_ENV}."
        ) from exc
    return NatsBus(
        client,
        NatsOptions(
            servers=options.servers,
            name=options.name,
            connect_timeout_s=options.connect_timeout_s,
            reconnect_wait_s=options.reconnect_wait_s,
            max_reconnect_attempts=options.max_reconnect_attempts,
            publish_deadline_s=10.0,
        ),
    )
