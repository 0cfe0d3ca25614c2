"""Tenants of a gfair cluster, and the NATS authorization that confines each one to its own jobs.

A small TOML file names the tenants (`deploy/nats/tenants.toml`); `render_auth_conf` turns it
into the server's `authorization` block (`deploy/nats/auth.conf`, via `gfair tenants render`).
Services and the operator may do anything. A tenant may publish only its own submissions and
cancellations and read only its own jobs' events, live or from the GFAIR_JOBS stream; see
`tenant_permissions` for the exact grants and why each is safe.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gfair.bus.nats_bus import inbox_prefix_for
from gfair.events.subjects import (
    JOBS_STREAM,
    PREFIX,
    SubjectError,
    cancel_subject,
    submit_subject,
    validate_token,
)

OPERATOR_USER = "operator"
SERVICES_USER_VARIABLE = "GFAIR_SERVICES_USER"
SERVICES_PASSWORD_VARIABLE = "GFAIR_SERVICES_PASSWORD"
OPERATOR_PASSWORD_VARIABLE = "GFAIR_OPERATOR_PASSWORD"
# The JetStream flow-control replies of consumers on GFAIR_JOBS: a push consumer stalls when
# its reader may not answer them. Only the consumer named in the subject acts on one.
_FLOW_CONTROL = f"$JS.FC.{JOBS_STREAM.name}.>"


class TenantsError(ValueError):
    """The tenants file is not valid; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    # May read its jobs' past events from the stream, not only follow them live.
    history: bool = True

    @property
    def variable_stem(self) -> str:
        return self.name.upper().replace("-", "_")

    @property
    def password_variable(self) -> str:
        """The environment variable the server reads this tenant's password from."""
        return f"GFAIR_TENANT_{self.variable_stem}_PASSWORD"

    @property
    def permissions_variable(self) -> str:
        return f"TENANT_{self.variable_stem}"

    @property
    def inbox_prefix(self) -> str:
        """What the tenant's clients pass as `inbox_prefix` (gfair tools derive it themselves)."""
        return inbox_prefix_for(self.name)


@dataclass(frozen=True, slots=True)
class Tenants:
    tenants: tuple[Tenant, ...] = ()
    # The services' durable consumers on GFAIR_JOBS. The create API a tenant may call would
    # also update an existing consumer of any name; these names are denied so no tenant can
    # re-filter a service's consumer and starve it.
    protected_consumers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for tenant in self.tenants:
            validate_token(tenant.name, what="tenant name")
            if tenant.name == OPERATOR_USER:
                raise ValueError(f"tenant name {OPERATOR_USER!r} is the operator's user")
            clash = seen.get(tenant.variable_stem)
            if clash is not None:
                raise ValueError(
                    f"tenants {clash!r} and {tenant.name!r} would share the password variable "
                    f"{tenant.password_variable}"
                )
            seen[tenant.variable_stem] = tenant.name
        for consumer in self.protected_consumers:
            validate_token(consumer, what="protected consumer name")


@dataclass(frozen=True, slots=True)
class TenantPermissions:
    publish_allow: tuple[str, ...]
    publish_deny: tuple[str, ...]
    subscribe_allow: tuple[str, ...]


def tenant_job_events(user: str) -> str:
    """Every event of every job of `user`."""
    return f"{PREFIX}.job.{validate_token(user, what='user')}.>"


def consumer_create_subject(stream: str, consumer: str, filter_subject: str) -> str:
    """The create API that carries the filter in its subject, so permissions can check it."""
    return f"$JS.API.CONSUMER.CREATE.{stream}.{consumer}.{filter_subject}"


def tenant_permissions(
    tenant: Tenant, protected_consumers: Sequence[str] = ()
) -> TenantPermissions:
    """What `tenant` may publish and subscribe to.

    - publish `gfair.submit.<t>` and `gfair.cancel.<t>`: its own requests, nobody else's;
    - subscribe `gfair.job.<t>.>`: its jobs' events as they happen;
    - subscribe `_INBOX_<t>.>`: replies to its own requests (JetStream acks, consumer
      deliveries). Not `_INBOX.>`, where everybody's replies go;
    - with `history`: create a consumer on GFAIR_JOBS through the subject-filtered API, whose
      filter must lie inside `gfair.job.<t>.>` (the server checks that the filter in the
      request equals the one in the subject and refuses multi-filter requests there), and
      answer its flow control. No pull API (`MSG.NEXT`), which would let it pull from any
      consumer, the services' included: a tenant's consumer delivers to its own inbox.
    """
    stream = JOBS_STREAM.name
    publish = [submit_subject(tenant.name), cancel_subject(tenant.name)]
    deny: list[str] = []
    if tenant.history:
        publish.append(consumer_create_subject(stream, "*", tenant_job_events(tenant.name)))
        publish.append(_FLOW_CONTROL)
        deny = [consumer_create_subject(stream, name, ">") for name in protected_consumers]
    return TenantPermissions(
        publish_allow=tuple(publish),
        publish_deny=tuple(deny),
        subscribe_allow=(tenant_job_events(tenant.name), f"{tenant.inbox_prefix}.>"),
    )


# --- the tenants file -------------------------------------------------------------------------

_TOP_KEYS = frozenset({"tenants", "jetstream"})
_JETSTREAM_KEYS = frozenset({"protected_consumers"})
_TENANT_KEYS = frozenset({"name", "history"})


def parse_tenants(text: str, *, source: str = "tenants file") -> Tenants:
    """Parse a tenants file; `TenantsError` names `source`, the line or the field at fault."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise TenantsError(f"{source}: {error}") from None
    _no_unknown_keys(document, _TOP_KEYS, source, "")
    jetstream = document.get("jetstream", {})
    if not isinstance(jetstream, Mapping):
        raise TenantsError(f"{source}: jetstream: expected a table")
    _no_unknown_keys(jetstream, _JETSTREAM_KEYS, source, "jetstream.")
    protected = _string_list(
        jetstream.get("protected_consumers", []), source, "jetstream.protected_consumers"
    )
    rows = document.get("tenants", [])
    if not isinstance(rows, list):
        raise TenantsError(f"{source}: tenants: expected an array of tables ([[tenants]])")
    tenants = [_tenant(row, source, f"tenants[{index}]") for index, row in enumerate(rows)]
    try:
        return Tenants(tenants=tuple(tenants), protected_consumers=tuple(protected))
    except (SubjectError, ValueError) as error:
        raise TenantsError(f"{source}: {error}") from None


def load_tenants(path: Path) -> Tenants:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise TenantsError(f"{path}: cannot read: {error.strerror or error}") from None
    return parse_tenants(text, source=str(path))


def _no_unknown_keys(
    table: Mapping[str, Any], known: frozenset[str], source: str, where: str
) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        expected = ", ".join(sorted(known))
        raise TenantsError(f"{source}: {where}{unknown[0]}: unknown key (known: {expected})")


def _string_list(value: Any, source: str, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise TenantsError(f"{source}: {where}: expected an array of strings")
    return list(value)


def _tenant(row: Any, source: str, where: str) -> Tenant:
    if not isinstance(row, Mapping):
        raise TenantsError(f"{source}: {where}: expected a table")
    _no_unknown_keys(row, _TENANT_KEYS, source, f"{where}.")
    name = row.get("name")
    if not isinstance(name, str):
        raise TenantsError(f"{source}: {where}.name: required, a string")
    try:
        validate_token(name, what="name")
    except SubjectError as error:
        raise TenantsError(f"{source}: {where}.name: {error}") from None
    history = row.get("history", True)
    if not isinstance(history, bool):
        raise TenantsError(f"{source}: {where}.history: expected true or false")
    return Tenant(name=name, history=history)


# --- rendering --------------------------------------------------------------------------------

_HEADER = """\
# NATS authorization for gfair: who may connect, and what each may publish and subscribe to.
# GENERATED from {source} by `gfair tenants render`; edit that file, not this one:
#   gfair tenants render {source} -o deploy/nats/auth.conf    (--check verifies)
#
# The services user (${services_user}) and `{operator}` may do anything. A tenant <t> may
#   - publish its own submissions and cancellations: gfair.submit.<t>, gfair.cancel.<t>;
#   - follow its jobs' events live: subscribe gfair.job.<t>.>;
#   - read them from the stream (history): create a consumer on {stream} through the
#     subject-filtered API, $JS.API.CONSUMER.CREATE.{stream}.<name>.gfair.job.<t>.<...>,
#     delivering to its own inbox, and answer its flow control ($JS.FC.{stream}.>);
#   - receive replies on _INBOX_<t>.> only: tenant clients connect with inbox prefix
#     _INBOX_<t> (nats-py: connect(inbox_prefix=...); gfair tools derive it from
#     GFAIR_NATS_USER, or set GFAIR_NATS_INBOX_PREFIX);
# and nothing else: no other user's subjects, no key-value buckets, no node commands, no
# stream or consumer administration. The services' durable consumers on {stream} are denied
# by name, so that no tenant can re-create (and so re-filter) them.
# Passwords come from the environment: ${services_password}, ${operator_password} and
# GFAIR_TENANT_<T>_PASSWORD for each tenant (upper case, '-' as '_').
"""


def _quoted(subject: str) -> str:
    return f'"{subject}"'


def _string_array(items: Sequence[str], indent: str) -> list[str]:
    return [f"{indent}{_quoted(item)}" for item in items]


def _tenant_block(tenant: Tenant, permissions: TenantPermissions, deny_variable: str) -> list[str]:
    lines = [f"  {tenant.permissions_variable} = {{", "    publish: {", "      allow: ["]
    lines += _string_array(permissions.publish_allow, "        ")
    lines.append("      ]")
    if permissions.publish_deny:
        lines.append(f"      deny: ${deny_variable}")
    lines += ["    }", "    subscribe: {", "      allow: ["]
    lines += _string_array(permissions.subscribe_allow, "        ")
    lines += ["      ]", "    }", "  }"]
    return lines


def render_auth_conf(tenants: Tenants, *, source: str = "deploy/nats/tenants.toml") -> str:
    """The `authorization` block for `tenants`, byte-for-byte reproducible."""
    deny_variable = "SERVICE_CONSUMERS"
    lines = [
        _HEADER.format(
            source=source,
            services_user=SERVICES_USER_VARIABLE,
            services_password=SERVICES_PASSWORD_VARIABLE,
            operator=OPERATOR_USER,
            operator_password=OPERATOR_PASSWORD_VARIABLE,
            stream=JOBS_STREAM.name,
        ).rstrip("\n"),
        "authorization {",
        "  SERVICE = {",
        '    publish: ">"',
        '    subscribe: ">"',
        "  }",
        "  OPERATOR = {",
        '    publish: ">"',
        '    subscribe: ">"',
        "  }",
    ]
    if any(t.history for t in tenants.tenants) and tenants.protected_consumers:
        lines.append(f"  # The services' durable consumers on {JOBS_STREAM.name}.")
        lines.append(f"  {deny_variable} = [")
        lines += _string_array(
            [
                consumer_create_subject(JOBS_STREAM.name, c, ">")
                for c in tenants.protected_consumers
            ],
            "    ",
        )
        lines.append("  ]")
    for tenant in tenants.tenants:
        permissions = tenant_permissions(tenant, tenants.protected_consumers)
        lines += _tenant_block(tenant, permissions, deny_variable)
    lines.append("  users: [")
    lines.append(
        f"    {{user: ${SERVICES_USER_VARIABLE}, password: ${SERVICES_PASSWORD_VARIABLE}, "
        "permissions: $SERVICE}"
    )
    lines.append(
        f"    {{user: {OPERATOR_USER}, password: ${OPERATOR_PASSWORD_VARIABLE}, "
        "permissions: $OPERATOR}"
    )
    for tenant in tenants.tenants:
        lines.append(
            # Quoted: a bare name such as 1234 would be read as a number.
            f'    {{user: "{tenant.name}", password: ${tenant.password_variable}, '
            f"permissions: ${tenant.permissions_variable}}}"
        )
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"
