"""Tenants and node executors of a gfair cluster, and the NATS accounts that confine each.

A small TOML file names the tenants and the nodes (`deploy/nats/tenants.toml`);
`render_auth_conf` turns it into the server's `accounts` block (`deploy/nats/auth.conf`, via
`gfair tenants render`). Services, the operator, the query service and the node executors log
in to the services' account (`SERVICES_ACCOUNT`), which alone has JetStream. Each tenant logs in
to an account of its own (`Tenant.account`), which imports from the services' account only its
own submission, cancellation and question subjects (as services: a reply subject the tenant
names stays in its own account, where no stream or key-value bucket exists, so the JetStream
ack of its submission cannot be written into any record) and its own jobs' events (as a
stream). Within the services' account, the executors and the query service hold only the
permissions each function here grants (`node_permissions`, `query_permissions`), and a
tenant's permissions in its own account (`tenant_permissions`) repeat what it imports.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gfair.bus.job_output import LOGS_STREAM, node_output_pattern
from gfair.bus.nats_bus import IMPORT_REPLY_PREFIX, inbox_prefix_for
from gfair.events.jobs import (
    JobCheckpointed,
    JobExited,
    JobMigrated,
    JobProgress,
    JobResumed,
    JobStarted,
    JobSuspended,
    RunReport,
)
from gfair.events.nodes import NodeEvent, NodeHeartbeat, NodeRegistered, NodeTelemetry
from gfair.events.subjects import (
    COMMANDS_STREAM,
    PREFIX,
    STREAMS,
    SubjectError,
    cancel_subject,
    dlq_subject,
    node_commands_pattern,
    node_subject,
    queries_pattern,
    submit_subject,
    validate_token,
)
from gfair.state import buckets

OPERATOR_USER = "operator"
# The account of every login but the tenants': the only one with JetStream.
SERVICES_ACCOUNT = "GFAIR"
TENANT_ACCOUNT_PREFIX = "TENANT_"
SERVICES_USER_VARIABLE = "GFAIR_SERVICES_USER"
SERVICES_PASSWORD_VARIABLE = "GFAIR_SERVICES_PASSWORD"
OPERATOR_PASSWORD_VARIABLE = "GFAIR_OPERATOR_PASSWORD"
# The query service's own login: it answers tenants, so it must not hold the services' rights.
QUERY_USER = "gfair-query"
QUERY_PASSWORD_VARIABLE = "GFAIR_QUERY_SERVICE_PASSWORD"
QUERY_PERMISSIONS_VARIABLE = "QUERY_SERVICE"
# The durable consumers the services keep (`gfair_services`; the node executors' are
# `NodeLogin.durable`). The query login may create, read and delete ephemeral consumers, whose
# names permissions cannot tell from these, so each of these is denied to it by name.
# tests/e2e/test_cluster_auth.py checks that every durable a running cluster has is listed.
SERVICE_DURABLES: tuple[str, ...] = (
    "failure-detector-jobs",
    "failure-detector-nodes",
    "placement-jobs",
    "placement-nodes",
    "profiler-jobs",
    "profiler-nodes",
    "split-stride-jobs",
    "split-stride-nodes",
    "split-stride-shares",
    "trading-auction-jobs",
    "trading-auction-nodes",
    "trading-auction-profiles",
    "trading-auction-shares",
)


class TenantsError(ValueError):
    """The tenants file is not valid; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str

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
    def account(self) -> str:
        """The tenant's own NATS account (never the services': no name there starts so)."""
        return f"{TENANT_ACCOUNT_PREFIX}{self.name}"

    @property
    def inbox_prefix(self) -> str:
        """What the tenant's clients pass as `inbox_prefix` (gfair tools derive it themselves)."""
        return inbox_prefix_for(self.name)


@dataclass(frozen=True, slots=True)
class NodeLogin:
    """A node executor's login: it may act for its own node only (`node_permissions`)."""

    node_id: str

    @property
    def user(self) -> str:
        """The NATS user (`GFAIR_NATS_USER` of the executor): never a tenant's name."""
        return f"{NODE_USER_PREFIX}{self.node_id}"

    @property
    def variable_stem(self) -> str:
        return self.node_id.upper().replace("-", "_")

    @property
    def password_variable(self) -> str:
        """The environment variable the server reads this node's password from."""
        return f"GFAIR_NODE_{self.variable_stem}_PASSWORD"

    @property
    def permissions_variable(self) -> str:
        return f"NODE_{self.variable_stem}"

    @property
    def inbox_prefix(self) -> str:
        return inbox_prefix_for(self.user)

    @property
    def durable(self) -> str:
        """The executor's durable consumer of its commands (`NodeExecutor`)."""
        return f"node-executor-{self.node_id}"


NODE_USER_PREFIX = "node-"


@dataclass(frozen=True, slots=True)
class Tenants:
    tenants: tuple[Tenant, ...] = ()
    nodes: tuple[NodeLogin, ...] = ()

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for tenant in self.tenants:
            validate_token(tenant.name, what="tenant name")
            if tenant.name == OPERATOR_USER:
                raise ValueError(f"tenant name {OPERATOR_USER!r} is the operator's user")
            if tenant.name == QUERY_USER:
                raise ValueError(f"tenant name {QUERY_USER!r} is the query service's user")
            clash = seen.get(tenant.variable_stem)
            if clash is not None:
                raise ValueError(
                    f"tenants {clash!r} and {tenant.name!r} would share the password variable "
                    f"{tenant.password_variable}"
                )
            seen[tenant.variable_stem] = tenant.name
        tenant_names = {tenant.name for tenant in self.tenants}
        node_stems: dict[str, str] = {}
        for node in self.nodes:
            validate_token(node.node_id, what="node id")
            validate_token(node.user, what=f"NATS user of node {node.node_id!r}")
            if node.user in tenant_names or node.user in (OPERATOR_USER, QUERY_USER):
                raise ValueError(f"node {node.node_id!r}: its user {node.user!r} is taken")
            clash = node_stems.get(node.variable_stem)
            if clash is not None:
                raise ValueError(
                    f"nodes {clash!r} and {node.node_id!r} would share the password variable "
                    f"{node.password_variable}"
                )
            node_stems[node.variable_stem] = node.node_id


@dataclass(frozen=True, slots=True)
class TenantPermissions:
    publish_allow: tuple[str, ...]
    subscribe_allow: tuple[str, ...]
    # Taken out of what `publish_allow` lets through (a deny wins in NATS).
    publish_deny: tuple[str, ...] = ()


def tenant_job_events(user: str) -> str:
    """Every event of every job of `user`."""
    return f"{PREFIX}.job.{validate_token(user, what='user')}.>"


def consumer_create_subject(stream: str, consumer: str, filter_subject: str) -> str:
    """The create API that carries the filter in its subject, so permissions can check it."""
    return f"$JS.API.CONSUMER.CREATE.{stream}.{consumer}.{filter_subject}"


def tenant_permissions(tenant: Tenant) -> TenantPermissions:
    """What `tenant` may publish and subscribe to.

    - publish `gfair.submit.<t>` and `gfair.cancel.<t>`: its own requests, nobody else's;
    - publish `gfair.query.<t>.*`: questions to the query service, which answers about the
      user the subject names only (its jobs, their events and output, its share);
    - subscribe `gfair.job.<t>.>`: its jobs' events as they happen;
    - subscribe `_INBOX_<t>.>`: replies to its own requests (JetStream acks, answers). Not
      `_INBOX.>`, where everybody's replies go.

    Nothing of the JetStream API: a consumer's configuration (durable or not, where it
    delivers) travels in the request body, which permissions cannot see, so a tenant allowed
    to create one could create any; the query service reads the streams for it instead. Its
    account has no JetStream anyway, and the subjects above are imports (`tenant_imports`):
    these permissions keep a tenant's logins from using their account for anything else.
    """
    return TenantPermissions(
        publish_allow=(
            submit_subject(tenant.name),
            cancel_subject(tenant.name),
            queries_pattern(tenant.name),
        ),
        subscribe_allow=(tenant_job_events(tenant.name), f"{tenant.inbox_prefix}.>"),
    )


# What a node executor reports, each on its own subject: its node's inventory and liveness,
# and the life of the runs it carries out. Never a decision (accepted, placed, completed, ...).
NODE_REPORTS: tuple[type[NodeEvent], ...] = (NodeRegistered, NodeHeartbeat, NodeTelemetry)
RUN_REPORTS: tuple[type[RunReport], ...] = (
    JobStarted,
    JobResumed,
    JobProgress,
    JobCheckpointed,
    JobSuspended,
    JobMigrated,
    JobExited,
)


def _js_api(*tokens: str) -> str:
    return ".".join(("$JS.API", *tokens))


def node_permissions(node: NodeLogin) -> TenantPermissions:
    """What the executor of `node` may publish and subscribe to.

    - publish its node's reports, `gfair.node.<n>.registered|heartbeat|telemetry`, not the
      failure detector's verdicts on the same subjects (suspected, failed, ...);
    - publish run reports and output of the jobs it runs, on subjects that end with its node
      (`gfair.job.*.*.started.<n>`, ..., `gfair.logs.*.*.*.<n>`): it cannot speak for
      another node, and a report whose payload names another node is refused on arrival;
    - publish dead letters of its commands;
    - its command consumer: create it through the subject-filtered API under its own name
      and filter only (`gfair.cmd.<n>.*`), pull from it, acknowledge its messages;
    - read, not write: JetStream's account info, stream info (every process checks that the
      topology it declares exists; changing it is the services'), and no record (a start is
      judged by its command alone);
    - receive replies on `_INBOX_node-<n>.>` only.
    """
    commands = COMMANDS_STREAM.name
    stream_names = [s.name for s in STREAMS] + [LOGS_STREAM]
    stream_names += [f"KV_{bucket.name}" for bucket in buckets.ALL]
    publish = [node_subject(node.node_id, m.event_name()) for m in NODE_REPORTS]
    publish += [m.reported_by(node.node_id) for m in RUN_REPORTS]
    publish += [node_output_pattern(node.node_id), dlq_subject(commands)]
    publish += [
        _js_api("INFO"),
        _js_api("STREAM", "NAMES"),
        *(_js_api("STREAM", "INFO", name) for name in stream_names),
        consumer_create_subject(commands, node.durable, node_commands_pattern(node.node_id)),
        _js_api("CONSUMER", "INFO", commands, node.durable),
        _js_api("CONSUMER", "MSG", "NEXT", commands, node.durable),
        f"$JS.ACK.{commands}.{node.durable}.>",
    ]
    return TenantPermissions(
        publish_allow=tuple(publish), subscribe_allow=(f"{node.inbox_prefix}.>",)
    )


def query_permissions(tenants: Tenants) -> TenantPermissions:
    """What the query service (`QUERY_USER`) may publish and subscribe to.

    It answers on the reply subject its askers choose, so its login, not only its code, must
    keep an answer from being anything but an answer: an empty body sent to
    ``$JS.API.STREAM.PURGE.<stream>`` is a purge to JetStream.

    - publish answers on ``_R_.>``, where the server puts the replies of tenants' questions
      (they come through their accounts' imports, and the answer goes back to the tenant's own
      account), and on ``_INBOX_operator.>`` (the operator asks as itself about its own jobs,
      `gfair.client.query_access`);
    - read the records and streams, as `DirectAccess` does: stream info (a bucket is opened
      with it), direct and stored message gets (a key's value), and reading a stream through
      an ephemeral consumer of its own: create it (with or without a filter), pull from it
      (``CONSUMER.MSG.NEXT``), delete it when done;
    - subscribe to the questions, ``gfair.query.*.*``, and its own inbox, where its reads'
      replies come.

    Denied even where an allow would match: purging or deleting a stream or a message,
    creating, updating or deleting a stream, the durable-create API, and creating (which
    updates), pulling from or deleting any durable consumer of the services or a node
    executor (`SERVICE_DURABLES`, `NodeLogin.durable`); no gfair event, no key-value write, no
    acknowledgement. Ephemeral consumers' names are single tokens permissions cannot tell
    from a durable's, hence the list.
    """
    publish = [f"{IMPORT_REPLY_PREFIX}.>", f"{inbox_prefix_for(OPERATOR_USER)}.>"]
    publish += [
        _js_api("STREAM", "INFO", "*"),
        _js_api("DIRECT", "GET", ">"),
        _js_api("STREAM", "MSG", "GET", "*"),
        _js_api("CONSUMER", "CREATE", "*", "*"),
        _js_api("CONSUMER", "CREATE", "*", "*", ">"),
        _js_api("CONSUMER", "MSG", "NEXT", "*", "*"),
        _js_api("CONSUMER", "DELETE", "*", "*"),
    ]
    deny = [
        f"{PREFIX}.>",
        "$KV.>",
        "$JS.ACK.>",
        _js_api("STREAM", "PURGE", ">"),
        _js_api("STREAM", "DELETE", ">"),
        _js_api("STREAM", "MSG", "DELETE", ">"),
        _js_api("STREAM", "CREATE", ">"),
        _js_api("STREAM", "UPDATE", ">"),
        _js_api("CONSUMER", "DURABLE", "CREATE", ">"),
    ]
    durables = [*SERVICE_DURABLES, *(node.durable for node in tenants.nodes)]
    for durable in durables:
        deny += [
            _js_api("CONSUMER", "CREATE", "*", durable),
            _js_api("CONSUMER", "CREATE", "*", durable, ">"),
            _js_api("CONSUMER", "MSG", "NEXT", "*", durable),
            _js_api("CONSUMER", "DELETE", "*", durable),
        ]
    return TenantPermissions(
        publish_allow=tuple(publish),
        subscribe_allow=(queries_pattern(), f"{inbox_prefix_for(QUERY_USER)}.>"),
        publish_deny=tuple(deny),
    )


# --- the tenants file -------------------------------------------------------------------------

_TOP_KEYS = frozenset({"tenants", "nodes"})
_NODE_KEYS = frozenset({"id"})
_TENANT_KEYS = frozenset({"name"})
# Keys of earlier versions, and why they went: the file names them, so it must say so.
_RETIRED_KEYS = {
    "jetstream": "tenants create no consumers any more, so none need protecting from them; "
    "remove the [jetstream] table",
    "history": "every tenant reads its own jobs' events through the query service; remove it",
}


def parse_tenants(text: str, *, source: str = "tenants file") -> Tenants:
    """Parse a tenants file; `TenantsError` names `source`, the line or the field at fault."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise TenantsError(f"{source}: {error}") from None
    _no_unknown_keys(document, _TOP_KEYS, source, "")
    rows = document.get("tenants", [])
    if not isinstance(rows, list):
        raise TenantsError(f"{source}: tenants: expected an array of tables ([[tenants]])")
    tenants = [_tenant(row, source, f"tenants[{index}]") for index, row in enumerate(rows)]
    node_rows = document.get("nodes", [])
    if not isinstance(node_rows, list):
        raise TenantsError(f"{source}: nodes: expected an array of tables ([[nodes]])")
    nodes = [_node(row, source, f"nodes[{index}]") for index, row in enumerate(node_rows)]
    try:
        return Tenants(tenants=tuple(tenants), nodes=tuple(nodes))
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
    for key in unknown:
        if key in _RETIRED_KEYS:
            raise TenantsError(f"{source}: {where}{key}: no longer used: {_RETIRED_KEYS[key]}")
    if unknown:
        expected = ", ".join(sorted(known))
        raise TenantsError(f"{source}: {where}{unknown[0]}: unknown key (known: {expected})")


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
    return Tenant(name=name)


def _node(row: Any, source: str, where: str) -> NodeLogin:
    if not isinstance(row, Mapping):
        raise TenantsError(f"{source}: {where}: expected a table")
    _no_unknown_keys(row, _NODE_KEYS, source, f"{where}.")
    node_id = row.get("id")
    if not isinstance(node_id, str):
        raise TenantsError(f"{source}: {where}.id: required, a string (the executor's node id)")
    try:
        validate_token(node_id, what="id")
        validate_token(f"{NODE_USER_PREFIX}{node_id}", what="its NATS user")
    except SubjectError as error:
        raise TenantsError(f"{source}: {where}.id: {error}") from None
    return NodeLogin(node_id=node_id)


# --- rendering --------------------------------------------------------------------------------

_HEADER = """\
# NATS accounts for gfair: who may connect, and what each may publish and subscribe to.
# GENERATED from {source} by `gfair tenants render`; edit that file, not this one:
#   gfair tenants render {source} -o deploy/nats/auth.conf    (--check verifies)
#
# Account {services}, the only one with JetStream: the services user (${services_user}) and
# `{operator}` may do anything there; node executors and the query service only what their
# permissions below say. Every tenant <t> has an account of its own, {tenant_prefix}<t>, which
# imports from {services} just
#   - its own submissions and cancellations, gfair.submit.<t> and gfair.cancel.<t>, and its
#     questions to the query service, gfair.query.<t>.*: imported as services, so the reply
#     subject a tenant names stays in its own account (no stream, no key-value bucket, no
#     JetStream API there) and the JetStream ack or the answer goes back to it, never into a
#     record;
#   - its jobs' events, gfair.job.<t>.>, as a stream, to follow them live;
# and may use no other subject. Tenant clients connect with inbox prefix _INBOX_<t>
# (nats-py: connect(inbox_prefix=...); gfair tools derive it from GFAIR_NATS_USER, or set
# GFAIR_NATS_INBOX_PREFIX).
# The executor of a node <n> logs in as node-<n> and may publish its node's reports
# (gfair.node.<n>.registered|heartbeat|telemetry), its run reports of jobs and their output
# (gfair.job.*.*.started.<n>, ..., gfair.logs.*.*.*.<n>), take its commands from its own consumer
# (node-executor-<n>, filter gfair.cmd.<n>.*), read stream info and job records; nothing else.
# The query service logs in as {query_user} and may only answer (on _R_.>, where the server
# maps the replies of the tenants' questions, and on _INBOX_{operator}.>) and read: stream
# info, message gets, and ephemeral consumers of its own (create, pull, delete). Denied:
# purging or deleting streams or messages, changing streams, any gfair.> publish, and
# creating, pulling from or deleting any durable of the services or the node executors.
# Passwords come from the environment: ${services_password}, ${operator_password},
# ${query_password},
# GFAIR_TENANT_<T>_PASSWORD for each tenant and GFAIR_NODE_<N>_PASSWORD for each node
# (upper case, '-' as '_').
"""


def _quoted(subject: str) -> str:
    return f'"{subject}"'


def _string_array(items: Sequence[str], indent: str) -> list[str]:
    return [f"{indent}{_quoted(item)}" for item in items]


def _permissions_block(variable: str, permissions: TenantPermissions) -> list[str]:
    lines = [f"{variable} = {{", "  publish: {", "    allow: ["]
    lines += _string_array(permissions.publish_allow, "      ")
    lines += ["    ]"]
    if permissions.publish_deny:
        lines += ["    deny: ["]
        lines += _string_array(permissions.publish_deny, "      ")
        lines += ["    ]"]
    lines += ["  }", "  subscribe: {", "    allow: ["]
    lines += _string_array(permissions.subscribe_allow, "      ")
    lines += ["    ]", "  }", "}"]
    return lines


@dataclass(frozen=True, slots=True)
class TenantImports:
    """What a tenant's account takes from the services' account, and nothing more."""

    services: tuple[str, ...]
    streams: tuple[str, ...]

    def by_kind(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(``service`` or ``stream``, subjects): as exports and imports name them."""
        return (("service", self.services), ("stream", self.streams))


def tenant_imports(tenant: Tenant) -> TenantImports:
    """Its requests as services (replies remapped into its own account), its events as a stream."""
    return TenantImports(
        services=(
            submit_subject(tenant.name),
            cancel_subject(tenant.name),
            queries_pattern(tenant.name),
        ),
        streams=(tenant_job_events(tenant.name),),
    )


# The services' and the operator's permissions: everything in their account.
_ALL_RIGHTS = "ALL_RIGHTS"


def _login(user: str, password_variable: str, permissions_variable: str) -> str:
    # Quoted: a bare name such as 1234 would be read as a number.
    return (
        f'{{user: "{user}", password: ${password_variable}, permissions: ${permissions_variable}}}'
    )


def _services_account(tenants: Tenants) -> list[str]:
    lines = [f"  {SERVICES_ACCOUNT}: {{", "    jetstream: enabled", "    users: ["]
    logins = [
        f"{{user: ${SERVICES_USER_VARIABLE}, password: ${SERVICES_PASSWORD_VARIABLE}, "
        f"permissions: ${_ALL_RIGHTS}}}",
        _login(OPERATOR_USER, OPERATOR_PASSWORD_VARIABLE, _ALL_RIGHTS),
        _login(QUERY_USER, QUERY_PASSWORD_VARIABLE, QUERY_PERMISSIONS_VARIABLE),
        *(_login(n.user, n.password_variable, n.permissions_variable) for n in tenants.nodes),
    ]
    lines += [f"      {login}" for login in logins]
    lines += ["    ]", "    exports: ["]
    for tenant in tenants.tenants:
        for kind, subjects in tenant_imports(tenant).by_kind():
            lines += [
                f'      {{{kind}: "{subject}", accounts: ["{tenant.account}"]}}'
                for subject in subjects
            ]
    lines += ["    ]", "  }"]
    return lines


def _tenant_account(tenant: Tenant) -> list[str]:
    lines = [f'  "{tenant.account}": {{', "    users: ["]
    lines.append(
        f"      {_login(tenant.name, tenant.password_variable, tenant.permissions_variable)}"
    )
    lines += ["    ]", "    imports: ["]
    for kind, subjects in tenant_imports(tenant).by_kind():
        lines += [
            f'      {{{kind}: {{account: "{SERVICES_ACCOUNT}", subject: "{subject}"}}}}'
            for subject in subjects
        ]
    lines += ["    ]", "  }"]
    return lines


def render_auth_conf(tenants: Tenants, *, source: str = "deploy/nats/tenants.toml") -> str:
    """The permissions and `accounts` block for `tenants`, byte-for-byte reproducible."""
    lines = [
        _HEADER.format(
            source=source,
            services=SERVICES_ACCOUNT,
            tenant_prefix=TENANT_ACCOUNT_PREFIX,
            services_user=SERVICES_USER_VARIABLE,
            services_password=SERVICES_PASSWORD_VARIABLE,
            operator=OPERATOR_USER,
            operator_password=OPERATOR_PASSWORD_VARIABLE,
            query_user=QUERY_USER,
            query_password=QUERY_PASSWORD_VARIABLE,
        ).rstrip("\n"),
        # Not OPERATOR: a top-level name is also read as the server's setting of that name.
        f'{_ALL_RIGHTS} = {{publish: ">", subscribe: ">"}}',
    ]
    lines += _permissions_block(QUERY_PERMISSIONS_VARIABLE, query_permissions(tenants))
    for tenant in tenants.tenants:
        lines += _permissions_block(tenant.permissions_variable, tenant_permissions(tenant))
    for node in tenants.nodes:
        lines += _permissions_block(node.permissions_variable, node_permissions(node))
    lines += ["accounts {", *_services_account(tenants)]
    for tenant in tenants.tenants:
        lines += _tenant_account(tenant)
    lines.append("}")
    return "\n".join(lines) + "\n"
