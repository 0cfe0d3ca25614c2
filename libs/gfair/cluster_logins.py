"""The logins of an embedded cluster run with a tenants file (`gfair up --auth FILE`).

The production authorization (`deploy/nats/`, `gfair.tenancy`) applied to one machine: the
tenants file is rendered into the cluster's own ``<data-dir>/auth/auth.conf``, exactly as
`gfair tenants render` would, and every login gets a fresh random password, handed to the
nats-server through its environment (the rendered file holds none). The services log in as
``gfair-services``, the query service as ``gfair-query`` (it may only read and answer,
`gfair.tenancy.query_permissions`), each node executor as ``node-<id>``, each tenant in an
account of its own (`gfair.tenancy`), and the tenants and the operator get
their ``GFAIR_NATS_*`` exports in ``<data-dir>/auth/`` (private files) and on the terminal.

One thing is added to the file as it is rendered, because the embedded cluster, not the user,
decides it: a ``[[nodes]]`` entry for every simulated server (``v100-0``, ...) the file does
not already declare.
"""

from __future__ import annotations

import os
import secrets
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gfair.events.subjects import SubjectError
from gfair.tenancy import (
    OPERATOR_PASSWORD_VARIABLE,
    OPERATOR_USER,
    QUERY_PASSWORD_VARIABLE,
    QUERY_USER,
    SERVICES_PASSWORD_VARIABLE,
    SERVICES_USER_VARIABLE,
    NodeLogin,
    Tenants,
    TenantsError,
    load_tenants,
    render_auth_conf,
)

# The services' user name in compose and deploy/nats/README.md; one name everywhere.
SERVICES_USER = "gfair-services"
AUTH_DIR = "auth"
AUTH_CONF = "auth.conf"
LOGINS_FILE = "logins.txt"
# 32 letters and digits: about 190 bits. The server parses a `$VARIABLE`'s value as it would a
# value in the file, so a password that looks like a number or holds '#', ',' or a quote
# would not come through as the same string; a letter first and letters and digits after do.
_PASSWORD_LENGTH = 32
_PASSWORD_FIRST = string.ascii_letters
_PASSWORD_REST = string.ascii_letters + string.digits


def new_password() -> str:
    rest = "".join(secrets.choice(_PASSWORD_REST) for _ in range(_PASSWORD_LENGTH - 1))
    return secrets.choice(_PASSWORD_FIRST) + rest


@dataclass(frozen=True, slots=True)
class Login:
    """One NATS user of the cluster and its password."""

    user: str
    # The server's variable for the password, as the rendered auth.conf names it.
    password_variable: str
    password: str = field(default_factory=new_password, repr=False)

    def client_env(self) -> dict[str, str]:
        """What a gfair process logging in as this user runs with (`BusSettings`)."""
        return {"GFAIR_NATS_USER": self.user, "GFAIR_NATS_PASSWORD": self.password}


def embedded_tenants(
    tenants: Tenants,
    *,
    node_ids: Sequence[str],
    source: str = "tenants file",
) -> Tenants:
    """`tenants` as the embedded cluster renders them: its nodes added.

    The simulated servers' ids come from the cluster spec, which a user writing the file for
    production would not know; requiring them in the file would only make it fail to start.
    """
    declared = {node.node_id for node in tenants.nodes}
    nodes = tenants.nodes + tuple(NodeLogin(n) for n in node_ids if n not in declared)
    for tenant in tenants.tenants:
        if tenant.name == SERVICES_USER:
            raise TenantsError(
                f"{source}: tenant {tenant.name!r} is the services' user in gfair up; rename it"
            )
    try:
        return Tenants(tenants=tenants.tenants, nodes=nodes)
    except (SubjectError, ValueError) as error:
        # A tenant called node-<id> for a simulated server, say.
        raise TenantsError(f"{source}: with the cluster's own nodes added: {error}") from None


def load_embedded_tenants(path: Path, *, node_ids: Sequence[str]) -> Tenants:
    """Read and check the tenants file at `path`; `TenantsError` says what is wrong."""
    if path.is_dir():
        raise TenantsError(f"{path}: a directory, not a tenants file (TOML)")
    return embedded_tenants(load_tenants(path), node_ids=node_ids, source=str(path))


@dataclass(frozen=True)
class ClusterLogins:
    """Every login of one run of the cluster, each with a password new to this run."""

    tenants: Tenants
    source: str
    services: Login = field(
        default_factory=lambda: Login(SERVICES_USER, SERVICES_PASSWORD_VARIABLE)
    )
    operator: Login = field(
        default_factory=lambda: Login(OPERATOR_USER, OPERATOR_PASSWORD_VARIABLE)
    )
    query: Login = field(default_factory=lambda: Login(QUERY_USER, QUERY_PASSWORD_VARIABLE))
    tenant_logins: tuple[Login, ...] = field(init=False)
    node_logins: Mapping[str, Login] = field(init=False)

    def __post_init__(self) -> None:
        tenant_logins = tuple(Login(t.name, t.password_variable) for t in self.tenants.tenants)
        node_logins = {n.node_id: Login(n.user, n.password_variable) for n in self.tenants.nodes}
        object.__setattr__(self, "tenant_logins", tenant_logins)
        object.__setattr__(self, "node_logins", node_logins)

    def node(self, node_id: str) -> Login:
        return self.node_logins[node_id]

    def server_env(self) -> dict[str, str]:
        """The variables the rendered auth.conf reads: the services' user and every password."""
        logins = [
            self.services,
            self.operator,
            self.query,
            *self.tenant_logins,
            *self.node_logins.values(),
        ]
        env = {login.password_variable: login.password for login in logins}
        env[SERVICES_USER_VARIABLE] = self.services.user
        return env

    def auth_conf(self) -> str:
        # The rendered header tells how to re-render deploy/nats/auth.conf; this copy is not
        # that file, and is made anew at every start.
        note = (
            f"# Rendered by `gfair up --auth {self.source}` at every start, with the cluster's "
            "nodes and the\n# services' consumers added; edits here are lost.\n"
        )
        return note + render_auth_conf(self.tenants, source=self.source)

    def connect_text(self, nats_url: str) -> str:
        """How the operator and each tenant log in, as shell lines to paste or source."""
        lines = [f"# Logins of the gfair cluster at {nats_url}; passwords change at every start."]
        for login, gfair_user in self._sourced():
            if gfair_user is None:
                lines.append(f"# {login.user}: may do anything (gfair jobs, nodes, users, ...)")
            else:
                lines.append(f"# tenant {login.user}: submits, cancels, follows its own jobs only")
            lines.append(_exports(nats_url, login, gfair_user=gfair_user))
        return "\n".join(lines) + "\n"

    def write_auth_conf(self, directory: Path) -> Path:
        """The rendered authorization, for the brokers; it holds no password."""
        _private_dir(directory)
        path = directory / AUTH_CONF
        path.write_text(self.auth_conf(), encoding="utf-8")
        return path

    def write_logins(self, directory: Path, nats_url: str) -> Path:
        """`LOGINS_FILE` and one ``<user>.env`` per login to source, private to this user."""
        _private_dir(directory)
        _write_private(directory / LOGINS_FILE, self.connect_text(nats_url))
        for login, gfair_user in self._sourced():
            text = _exports(nats_url, login, gfair_user=gfair_user)
            _write_private(directory / f"{login.user}.env", text + "\n")
        return directory / LOGINS_FILE

    def remove_logins(self, directory: Path) -> None:
        """Remove what `write_logins` wrote: once the cluster stops, its passwords are void."""
        (directory / LOGINS_FILE).unlink(missing_ok=True)
        for login, _ in self._sourced():
            (directory / f"{login.user}.env").unlink(missing_ok=True)

    def _sourced(self) -> list[tuple[Login, str | None]]:
        """The logins given to people, each with the `GFAIR_USER` its tools act for."""
        return [(self.operator, None), *((login, login.user) for login in self.tenant_logins)]


def _exports(nats_url: str, login: Login, *, gfair_user: str | None = None) -> str:
    # GFAIR_USER too for a tenant: `gfair submit` and friends then act for it without --user.
    user = f" GFAIR_USER={gfair_user}" if gfair_user is not None else ""
    return (
        f"export GFAIR_NATS_URL={nats_url} GFAIR_NATS_USER={login.user} "
        f"GFAIR_NATS_PASSWORD={login.password}{user}"
    )


def _private_dir(directory: Path) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    # mkdir's mode does not apply to a directory left by an earlier run.
    directory.chmod(0o700)


def _write_private(path: Path, text: str) -> None:
    """Write `text` readable by this user only, from the first byte on."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        # O_CREAT's mode does not apply to a file left by an earlier run.
        os.fchmod(handle.fileno(), 0o600)
        handle.write(text)
