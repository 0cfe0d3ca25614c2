"""The embedded cluster: brokers, services and executors started, watched and stopped.

See the package's docstring for what it runs and how.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Self

import structlog

from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.publisher import EVENT_ID_KEY_VARIABLE
from gfair.client.cluster_context import (
    CONTEXT_FILE,
    own_context,
    remove_context,
    remove_stale_contexts,
    user_context_path,
    write_context,
)
from gfair.cluster_logins import AUTH_DIR, ClusterLogins, Login
from gfair.core.cluster import Server
from gfair_services.node_executor.virtual_nodes import virtual_parts
from gfair_services.topology import cluster_topology

from .brokers import Brokers
from .children import Child, Children
from .options import QUERY_SERVICE, ClusterOptions
from .readiness import answering, consuming, registered_since
from .strays import kill_marked, stop_jobs

_log = structlog.get_logger("gfair.embedded_cluster")

NODE_EXECUTOR = "node_executor"
# The children that run the virtual nodes (`ClusterOptions.virtual`): `virtual-nodes-<part>`.
VIRTUAL_NODES = "virtual-nodes"
EVENT_ID_KEY_FILE = "event-id.key"
# Other ways to log in that a child could inherit from the environment of `gfair up`; with
# `auth` every child logs in with its own user and password, and NATS takes one kind at a time.
_OTHER_CREDENTIALS = (
    "GFAIR_NATS_TOKEN",
    "GFAIR_NATS_CREDS",
    "GFAIR_NATS_NKEY_SEED",
    "GFAIR_NATS_INBOX_PREFIX",
)


def virtual_nodes_child(part: int) -> str:
    """The name of the child that runs part `part` of the virtual nodes."""
    return f"{VIRTUAL_NODES}-{part}"


class ClusterError(RuntimeError):
    """The cluster would not start, or a part of it died while starting."""


class EmbeddedCluster:
    def __init__(self, options: ClusterOptions | None = None) -> None:
        self.options = options or ClusterOptions()
        self.data_dir = self.options.data_dir.expanduser().absolute()
        self.servers = self.options.servers()
        self.span_file = (
            self.options.span_file or self.data_dir / "traces" / "spans.jsonl"
        ).absolute()
        self.brokers = Brokers(self.data_dir, self.logs_dir, max_payload=self.options.max_payload)
        self._nats_url = self.options.nats_url
        self.children = Children(restart=self.options.restart_children)
        self.started_at: datetime | None = None
        self.context_files: tuple[Path, ...] = ()
        self._event_key: str | None = None
        self._virtual_child: dict[str, str] = {}  # virtual node id -> the child running it
        # Read here, so that a bad tenants file stops the cluster before anything starts.
        tenants = self.options.tenants()
        self.logins: ClusterLogins | None = None
        if tenants is not None:
            assert self.options.auth is not None
            self.logins = ClusterLogins(tenants, source=str(self.options.auth))

    # -- where things are ---------------------------------------------------------------------

    @property
    def nats_url(self) -> str:
        if self._nats_url is None:
            raise ClusterError("the cluster has not started")
        return self._nats_url

    @property
    def broker_urls(self) -> tuple[str, ...]:
        """Client URLs of the brokers this cluster started (empty with an external one)."""
        return self.brokers.urls

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(s.id for s in self.servers.servers)

    @property
    def checkpoint_root(self) -> Path:
        return self.data_dir / "checkpoints"

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def auth_dir(self) -> Path:
        """Where `auth` puts the rendered auth.conf and the logins."""
        return self.data_dir / AUTH_DIR

    def log_path(self, name: str) -> Path:
        return self.children[name].log_path

    def bus_options(self, name: str) -> NatsOptions:
        """How the cluster's own connections (set-up, readiness probes) reach the brokers."""
        servers = tuple(url for url in self.nats_url.split(",") if url)
        if self.logins is None:
            return NatsOptions(servers=servers, name=name)
        login = self.logins.services
        return NatsOptions(servers=servers, name=name, user=login.user, password=login.password)

    def _login_env(self, env: dict[str, str], login: Login | None) -> dict[str, str]:
        if login is None:
            return env
        for variable in _OTHER_CREDENTIALS:
            env.pop(variable, None)
        return env | login.client_env()

    def child_env(self) -> dict[str, str]:
        """The environment every child starts with."""
        env = dict(os.environ)
        if not env.get(EVENT_ID_KEY_VARIABLE):
            env[EVENT_ID_KEY_VARIABLE] = self._event_id_key()
        env.update(
            {
                "GFAIR_NATS_URL": self.nats_url,
                "GFAIR_SPAN_FILE": str(self.span_file),
                "GFAIR_LOG_LEVEL": self.options.log_level,
                "GFAIR_LOG_FORMAT": "json",
                "GFAIR_QUANTUM_S": f"{self.options.quantum_s:g}",
                "GFAIR_CHECKPOINT_ROOT": str(self.checkpoint_root),
                "GFAIR_HEARTBEAT_S": f"{self.options.heartbeat_s:g}",
                "GFAIR_REPLICAS": str(self.options.stream_replicas),
                "PYTHONUNBUFFERED": "1",
                "PATH": interpreter_first(env.get("PATH")),
            }
        )
        if self.options.user_tickets:
            env["GFAIR_USER_TICKETS"] = ",".join(
                f"{user}={tickets:g}" for user, tickets in self.options.user_tickets.items()
            )
        if self.options.shares_file is not None:
            env["GFAIR_SHARES_FILE"] = str(self.options.shares_file.expanduser().resolve())
        env.update(self.options.env)
        return env

    # -- start ----------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        self.started_at = datetime.now(UTC)
        for folder in (self.logs_dir, self.span_file.parent, self.checkpoint_root):
            folder.mkdir(parents=True, exist_ok=True)
        # Private, but for the passage jobs (running as their tenants' accounts) take to their
        # own directories below the data dir.
        for folder in (self.logs_dir, self.span_file.parent):
            folder.chmod(0o700)
        nodes = self.data_dir / "nodes"  # the executors' work roots (`node_work_root`)
        nodes.mkdir(exist_ok=True)
        for folder in (self.data_dir, self.checkpoint_root, nodes):
            folder.chmod(0o711)
        if os.geteuid() == 0 and not _open_to_others(Path(sys.executable)):
            # Jobs run as their tenants' accounts, and their `python` is this one.
            _log.warning(
                "the jobs' accounts cannot run this interpreter: a job's `python` will fail "
                "with 'Permission denied' (build .venv on an open Python: scripts/venv_python.py)",
                interpreter=sys.executable,
            )
        try:
            if self._nats_url is None:
                config_file, server_env = self._broker_auth()
                self._nats_url = await self.brokers.start(
                    self.options.brokers,
                    self.options.preferred_port,
                    config_file=config_file,
                    env=server_env,
                )
            if self.logins is not None:
                self.logins.write_logins(self.auth_dir, self.nats_url)
            bus = await NatsBus.connect(self.bus_options("gfair-up"))
            try:
                await bus.ensure_topology(cluster_topology(replicas=self.options.stream_replicas))
                self._spawn_all()
                self.children.start_all()
                await self._wait_ready(bus)
            finally:
                await bus.close()
            if self.options.announce:
                self._announce()
        except BaseException:
            await self.stop()
            raise
        _log.info("cluster ready", nats=self.nats_url, nodes=len(self.node_ids))

    def _announce(self) -> None:
        assert self.started_at is not None
        context = own_context(
            self.nats_url,
            data_dir=self.data_dir,
            span_file=self.span_file,
            started_at=self.started_at.isoformat(),
        )
        remove_stale_contexts()
        user = user_context_path()
        paths = [self.data_dir / CONTEXT_FILE] + ([user] if user is not None else [])
        self.context_files = tuple(write_context(context, paths))
        for path in self.context_files:
            with contextlib.suppress(OSError):
                path.chmod(0o600)

    def _broker_auth(self) -> tuple[Path | None, dict[str, str]]:
        """The brokers' config file and environment: with `auth`, the rendered authorization
        and the passwords it reads; without, none."""
        if self.logins is None:
            return None, {}
        config = self.logins.write_auth_conf(self.auth_dir)
        return config, self.logins.server_env()

    def _spawn_all(self) -> None:
        base = self.child_env()
        logins = self.logins
        services_env = self._login_env(dict(base), logins.services if logins else None)
        # The query service answers on reply subjects tenants choose: it gets its own, narrow
        # login (`gfair.tenancy.query_permissions`), not the services' rights.
        query_env = self._login_env(dict(base), logins.query if logins else None)
        for name in self.options.services:
            log = self.logs_dir / f"{name.replace('_', '-')}.log"
            env = query_env if name == QUERY_SERVICE else services_env
            self.children[name] = Child(name, name, env, log)
        for part, servers in enumerate(self._virtual_parts()):
            env = dict(base) | {
                "GFAIR_VIRTUAL_NODES": self.options.cluster,
                "GFAIR_VIRTUAL_NODES_PER_PROCESS": str(self.options.virtual_per_process),
                "GFAIR_VIRTUAL_PART": str(part),
                "GFAIR_WORK_BASE": str(self.data_dir / "nodes"),
            }
            name = virtual_nodes_child(part)
            self.children[name] = Child(name, NODE_EXECUTOR, env, self.logs_dir / f"{name}.log")
            for server in servers:
                self._virtual_child[server.id] = name
        for server in () if self.options.virtual else self.servers.servers:
            env = self._login_env(dict(base), logins.node(server.id) if logins else None)
            env.update(
                {"GFAIR_NODE_ID": server.id, "GFAIR_WORK_ROOT": str(self.node_work_root(server.id))}
            )
            if not self.options.local_gpus:
                env["GFAIR_SIMULATE_GPUS"] = f"{server.generation}:{server.gpus}"
            self.children[server.id] = Child(
                server.id, NODE_EXECUTOR, env, self.logs_dir / f"node-{server.id}.log"
            )

    async def _wait_ready(self, bus: NatsBus) -> None:
        deadline = time.monotonic() + self.options.ready_timeout_s
        waiting_nodes = set(self.node_ids)
        waiting_services = {name.replace("_", "-") for name in self.options.services}
        while waiting_nodes or waiting_services:
            for child in self.children.values():
                if child.crashes or not child.alive:
                    raise ClusterError(
                        f"{child.name} exited while starting; its log "
                        f"({child.log_path}) ends:\n{child.log_tail()}"
                    )
            if waiting_nodes:
                assert self.started_at is not None
                waiting_nodes -= await registered_since(bus, self.started_at)
            if waiting_services:
                waiting_services -= await consuming(bus, waiting_services)
            if QUERY_SERVICE in waiting_services and await answering(bus):
                waiting_services.discard(QUERY_SERVICE)
            if time.monotonic() > deadline:
                missing = ", ".join(sorted(waiting_nodes | waiting_services))
                raise ClusterError(
                    f"cluster not ready within {self.options.ready_timeout_s:g}s; still "
                    f"waiting for {missing} (logs in {self.logs_dir})"
                )
            if waiting_nodes or waiting_services:
                await asyncio.sleep(0.1)

    def kill_node(self, node_id: str) -> int:
        """The server dies: SIGKILL its executor (left down until `revive`) and its jobs.

        Job processes run in sessions of their own and would outlive their executor; on a
        dead server they die with it. Returns how many job processes were killed (Linux:
        found through /proc by the control directory the executor gave them).
        """
        if self.options.virtual:
            raise ClusterError("virtual nodes share processes: none can be killed alone")
        self.children.kill(node_id, restart=False)
        killed = kill_marked((self.node_work_root(node_id),))
        _log.warning("node killed", node=node_id, jobs_killed=killed)
        return killed

    def _event_id_key(self) -> str:
        # Read once: every child of this cluster (restarts too) derives with the same key.
        if self._event_key is None:
            self._event_key = event_id_key(self.data_dir / EVENT_ID_KEY_FILE)
        return self._event_key

    def node_work_root(self, node_id: str) -> Path:
        return self.data_dir / "nodes" / node_id

    async def wait_serving(self, name: str, since: datetime, timeout_s: float = 60.0) -> float:
        """Until child `name` serves again after `since`; the seconds it took from `since`.

        A node executor serves once it has registered after `since` (on a virtual cluster,
        `name` is one of its servers, whose executor runs in a `virtual_nodes_child`); the
        query service once it answers; any other service once a live process of it pulls from
        its consumers: where the child was restarted after `since`, its new process, not what
        the killed one left (unacknowledged deliveries, pulls not yet expired).
        """
        child = self.children[self._virtual_child.get(name, name)]
        bus = await NatsBus.connect(self.bus_options("gfair-up-probe"))
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                started = child.started_at
                restarted = started if started is not None and started > since else None
                # A process killed but not yet seen gone serves no more, whatever it left.
                if child.alive and not child.kills:
                    if child.module == NODE_EXECUTOR:
                        if name in await registered_since(bus, since):
                            break
                    elif child.module == QUERY_SERVICE:
                        if await answering(bus):
                            break
                    elif await consuming(bus, {name.replace("_", "-")}, restarted):
                        break
                if time.monotonic() > deadline:
                    raise ClusterError(f"{name} not serving {timeout_s:g}s after {since}")
                await asyncio.sleep(0.1)
        finally:
            await bus.close()
        return (datetime.now(UTC) - since).total_seconds()

    def _virtual_parts(self) -> list[tuple[Server, ...]]:
        if not self.options.virtual:
            return []
        return virtual_parts(self.options.cluster, self.options.virtual_per_process)

    # -- stop -----------------------------------------------------------------------------------

    async def stop(self) -> None:
        # First, so that no tool finds a cluster that is going away.
        remove_context(self.context_files, os.getpid())
        self.context_files = ()
        await self.children.stop(self.options.stop_grace_s)
        work_roots = {node_id: self.node_work_root(node_id) for node_id in self.node_ids}
        await asyncio.to_thread(stop_jobs, work_roots, {**os.environ, **self.options.env})
        await self.brokers.stop()
        if self.logins is not None:
            self.logins.remove_logins(self.auth_dir)


def interpreter_first(path: str | None) -> str:
    """`path` (a PATH) with the folder of this interpreter first: a job's `python` is then the
    Python gfair runs on, with gfair importable, even in a shell that never activated its
    virtual environment (`gfair submit -- python -m gfair.sdk.synthetic`). The folder is the one
    `sys.executable` names, not where its links lead: a venv's `bin`, not the system's."""
    folder = str(Path(sys.executable).parent)
    rest = [entry for entry in (path or os.defpath).split(os.pathsep) if entry and entry != folder]
    return os.pathsep.join([folder, *rest])


def _open_to_others(path: Path) -> bool:
    """Whether an account with no special rights can run `path` (every folder above where it
    leads searchable by others, the file executable by them)."""
    try:
        real = path.resolve()
        return all(p.stat().st_mode & 0o001 for p in (real, *real.parents)) and all(
            p.stat().st_mode & 0o001 for p in path.parents
        )
    except OSError:
        return False


def event_id_key(path: Path) -> str:
    """The secret the cluster's services key their event ids with (`derived_event_id`),
    made once and kept beside the streams it protects, readable by its owner only: a restart
    on the same data dir must derive the same ids for the events it handles again."""
    try:
        return path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_hex(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(key + "\n")
    return key
