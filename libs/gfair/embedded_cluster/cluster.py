"""A whole gfair cluster on one machine: nats-server, the services, one node executor per server.

    async with EmbeddedCluster(ClusterOptions(cluster="v100:2x4,k80:2x4", quantum_s=3)) as c:
        ...  # c.nats_url, c.node_ids, c.log_path("placement")

`gfair up`, `gfair demo` and the end-to-end tests use it. Every service and executor is a child
process (``python -m gfair_services.<name>``) configured by ``GFAIR_*`` environment variables,
logging to ``<data-dir>/logs/<name>.log`` and tracing to one JSON Lines span file. Node
executors simulate the GPUs of the cluster spec (server ids as in `parse_cluster_spec`:
``v100-0``, ``v100-1``, ...) and share ``<data-dir>/checkpoints``. With ``cluster="local"``
the one server (``h200-0``, say) is this machine with its own GPUs, found through NVML.

Start-up: nats-server (unless an URL is given; its store is ``<data-dir>/nats``), the topology
once, then the children; the cluster is ready when every executor has registered since this
start and every service is pulling from its consumers. A child that dies is restarted with
growing back-off (services rebuild their state from the bus, docs/design.md §3.3). Stop:
SIGTERM to every child, SIGKILL to those still alive after a grace period, then nats-server.

With ``brokers=3`` the cluster runs three nats-servers joined by routes into one JetStream
cluster (stores ``<data-dir>/nats/n<i>``), every stream and bucket with three replicas, and
gives every child all three URLs: losing any one broker loses no event, and the clients
reconnect to the others by themselves. `kill_broker` and `restart_broker` stage that loss;
`kill(name, restart=False)` and `revive` stage a node or service that stays down a while.

With ``auth`` (`gfair up --auth FILE`, a tenants file) the brokers run the authorization
rendered from it into ``<data-dir>/auth/``, and every process logs in with a password of its
own, new at every start (`gfair.cluster_logins`): the services as ``gfair-services``, each
executor as ``node-<id>`` (the simulated servers are added to the file's ``[[nodes]]``). The
operator's and the tenants' logins are in `logins` and ``<data-dir>/auth/logins.txt``.

With ``virtual`` (`gfair up --virtual`) children ``virtual-nodes-0``, ``virtual-nodes-1``, ...
run an executor for every server, `virtual_per_process` servers each in the spec's order, their
jobs virtual (`gfair_services.node_executor.virtual_nodes`): no process per job, so one
machine holds a thousand servers; jobs must be the synthetic one. Each is restarted on its
own, as any child.

With ``announce`` (`gfair up`) the ready cluster writes its context files
(``<data-dir>/context.json`` and the per-user one, `gfair.client.cluster_context`), so that tools
find it without being told its URL, and removes them when it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import nats.errors
import structlog

from gfair.bus.history import read_history
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.publisher import EVENT_ID_KEY_VARIABLE
from gfair.bus.server import EmbeddedNatsServer, NatsServerConfig, NatsServerError
from gfair.client.cluster_context import (
    CONTEXT_FILE,
    own_context,
    remove_context,
    remove_stale_contexts,
    user_context_path,
    write_context,
)
from gfair.client.query_access import ask_query
from gfair.cluster_logins import (
    AUTH_DIR,
    ClusterLogins,
    Login,
    load_embedded_tenants,
)
from gfair.core.cluster import Cluster, Server, parse_cluster_spec
from gfair.events.nodes import NodeRegistered
from gfair.events.subjects import NODES_STREAM, STREAMS
from gfair.node.discovery import LOCAL_CLUSTER, local_cluster_spec
from gfair.node.gpu import NoGpusError
from gfair.node.job_cgroup import AUTO, CgroupError, locate, node_directory, sweep_node
from gfair.node.job_limits import kill_legacy, v1_hierarchies
from gfair.node.nvml import SIMULATE_HINT
from gfair.sdk.environment import ENV_CONTROL_DIR
from gfair.tenancy import OPERATOR_USER, Tenants, TenantsError
from gfair_services.node_executor.settings import DEFAULT_VIRTUAL_NODES_PER_PROCESS
from gfair_services.node_executor.virtual_nodes import virtual_parts
from gfair_services.topology import MAX_REPLICAS, cluster_topology

_log = structlog.get_logger("gfair.embedded_cluster")

# Scheduler services, in start order (node executors come after them, one per server).
SCHEDULER_SERVICES: tuple[str, ...] = (
    "failure_detector",
    "profiler",
    "trading_auction",
    "placement",
    "split_stride",
)
NODE_EXECUTOR = "node_executor"
# The children that run the virtual nodes (`ClusterOptions.virtual`): `virtual-nodes-<part>`.
VIRTUAL_NODES = "virtual-nodes"


def virtual_nodes_child(part: int) -> str:
    """The name of the child that runs part `part` of the virtual nodes."""
    return f"{VIRTUAL_NODES}-{part}"


# Tenants' reads; it decides nothing and consumes no stream.
QUERY_SERVICE = "query"
EVENT_ID_KEY_FILE = "event-id.key"
# A pull a killed process left waiting expires within its fetch timeout (the runner's 1 s).
_PULLS_EXPIRE = timedelta(seconds=2)
# A JetStream cluster needs a quorum of its brokers; three survive the loss of one.
BROKER_CLUSTER_NAME = "gfair"
# Other ways to log in that a child could inherit from the environment of `gfair up`; with
# `auth` every child logs in with its own user and password, and NATS takes one kind at a time.
_OTHER_CREDENTIALS = (
    "GFAIR_NATS_TOKEN",
    "GFAIR_NATS_CREDS",
    "GFAIR_NATS_NKEY_SEED",
    "GFAIR_NATS_INBOX_PREFIX",
)


class ClusterError(RuntimeError):
    """The cluster would not start, or a part of it died while starting."""


@functools.cache
def _local_spec() -> str:
    # Read once: the options are asked for their servers several times before the start.
    return local_cluster_spec()


@dataclass(frozen=True)
class ClusterOptions:
    cluster: str = "v100:2x4,k80:2x4"
    quantum_s: float = 3.0
    data_dir: Path = Path(".gfair")
    # An existing NATS (JetStream) server; None starts an embedded one.
    nats_url: str | None = None
    span_file: Path | None = None  # default <data-dir>/traces/spans.jsonl
    user_tickets: Mapping[str, float] = field(default_factory=dict)
    shares_file: Path | None = None  # GFAIR_SHARES_FILE of every service
    services: tuple[str, ...] = (*SCHEDULER_SERVICES, QUERY_SERVICE)
    heartbeat_s: float = 1.0
    log_level: str = "INFO"
    # More GFAIR_* settings for every child, e.g. {"GFAIR_FAIL_AFTER_S": "10"}.
    env: Mapping[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 60.0
    stop_grace_s: float = 15.0
    restart_children: bool = True
    # nats-servers to start when no `nats_url` is given: 1, or 3 for a local JetStream cluster.
    brokers: int = 1
    # Replicas of every stream and bucket (GFAIR_REPLICAS of every child); None: one per
    # broker, at most 3.
    replicas: int | None = None
    # The embedded broker's port if it is free (`gfair up`: 4222, where tools look by default);
    # None, or taken, a free port.
    preferred_port: int | None = None
    # Write the context file tools find the cluster by, once ready; removed on stop.
    announce: bool = False
    # A tenants file (deploy/nats/tenants.toml): the brokers require logins, rendered from it.
    auth: Path | None = None
    # Virtual nodes (`gfair up --virtual`): one process runs an executor per server, their
    # jobs virtual (no process per job; synthetic jobs only).
    virtual: bool = False
    # Virtual servers per child process, each child on a NATS connection of its own
    # (GFAIR_VIRTUAL_NODES_PER_PROCESS of the children).
    virtual_per_process: int = DEFAULT_VIRTUAL_NODES_PER_PROCESS
    # The embedded brokers' largest message, in bytes; None: nats-server's 1 MiB. Split-stride
    # stores its whole state as one message, past 1 MiB from about 2,000 jobs on
    # (docs/benchmarks.md, "The control plane at scale").
    max_payload: int | None = None

    def __post_init__(self) -> None:
        if self.brokers < 1:
            raise ValueError(f"brokers must be >= 1, not {self.brokers}")
        if self.brokers > 1 and self.nats_url is not None:
            raise ValueError("brokers are started only without nats_url; give one or the other")
        if self.replicas is not None and not 1 <= self.replicas <= MAX_REPLICAS:
            raise ValueError(f"replicas must be within 1..{MAX_REPLICAS}, not {self.replicas}")
        if self.auth is not None and self.nats_url is not None:
            raise ValueError(
                "auth configures the nats-server the cluster starts; an external one "
                "(nats_url) has its own authorization"
            )
        if self.virtual and self.local_gpus:
            raise ValueError("virtual nodes simulate their GPUs: name the servers, not 'local'")
        if self.virtual and self.auth is not None:
            raise ValueError(
                "virtual nodes share a connection per process, and auth gives every node a "
                "login of its own: run virtual nodes without auth"
            )
        if self.virtual_per_process < 1:
            raise ValueError(f"virtual_per_process must be >= 1, not {self.virtual_per_process}")
        if self.nats_url is None and self.stream_replicas > self.brokers:
            raise ValueError(
                f"{self.stream_replicas} replicas need as many brokers; {self.brokers} started"
            )

    @property
    def stream_replicas(self) -> int:
        return self.replicas if self.replicas is not None else min(self.brokers, 3)

    @property
    def local_gpus(self) -> bool:
        """Whether the one server is this machine, its GPUs real (``cluster="local"``)."""
        return self.cluster == LOCAL_CLUSTER

    def servers(self) -> Cluster:
        if not self.local_gpus:
            return parse_cluster_spec(self.cluster)
        try:
            return parse_cluster_spec(_local_spec())
        except NoGpusError as error:
            reason = str(error).removesuffix(f"; {SIMULATE_HINT}")
            raise ValueError(
                f"cluster 'local' runs jobs on this machine's GPUs, found through NVML: "
                f"{reason}; name simulated servers instead (e.g. v100:2x4)"
            ) from error

    def tenants(self) -> Tenants | None:
        """The tenants of `auth` with the cluster's nodes added; `TenantsError` if it is bad."""
        if self.auth is None:
            return None
        generated = (self.data_dir / AUTH_DIR).expanduser().absolute()
        if self.auth.expanduser().absolute().parent == generated:
            # The generated files would replace it, or sit beside it as if they were its own.
            raise TenantsError(f"{self.auth}: inside {generated}, where the cluster writes")
        return load_embedded_tenants(
            self.auth, node_ids=tuple(s.id for s in self.servers().servers)
        )


class Child:
    """One child process: how to start it, and its current incarnation."""

    def __init__(self, name: str, module: str, env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.module = module
        self.env = dict(env)
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.started_at: datetime | None = None  # when the current process was started
        self.crashes: list[int] = []  # exit codes of unexpected exits
        self.kills = 0  # exits asked for by `EmbeddedCluster.kill`, not yet seen
        # Killed on purpose and left down until `EmbeddedCluster.revive`.
        self.held = False
        self.exit_seen = False  # the watchdog has accounted for this incarnation's exit
        self._log: IO[bytes] | None = None

    @property
    def argv(self) -> list[str]:
        return [sys.executable, "-m", f"gfair_services.{self.module}"]

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self._log is None:
            # Logs name every tenant's jobs: readable by the cluster's user alone.
            fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._log = os.fdopen(fd, "ab")
        # A session of its own: a Ctrl-C on the terminal reaches `gfair up`, which then stops
        # the children in order, instead of every child at once.
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            # What the children write (spans, records) is their user's alone; what jobs must
            # reach, the executors open to them explicitly.
            umask=0o077,
        )
        self.starts += 1
        self.started_at = datetime.now(UTC)
        self.exit_seen = False

    @property
    def restarts(self) -> int:
        return max(self.starts - 1, 0)

    def signal(self, sig: signal.Signals) -> None:
        if self.alive:
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


class EmbeddedCluster:
    def __init__(self, options: ClusterOptions | None = None) -> None:
        self.options = options or ClusterOptions()
        self.data_dir = self.options.data_dir.expanduser().absolute()
        self.servers = self.options.servers()
        self.span_file = (
            self.options.span_file or self.data_dir / "traces" / "spans.jsonl"
        ).absolute()
        self._brokers: list[EmbeddedNatsServer] = []
        self._nats_url = self.options.nats_url
        self.children: dict[str, Child] = {}
        self._watchdog: asyncio.Task[None] | None = None
        self._stopping = False
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
        return tuple(broker.url for broker in self._brokers)

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
                self._nats_url = await self._start_brokers()
            if self.logins is not None:
                self.logins.write_logins(self.auth_dir, self.nats_url)
            bus = await NatsBus.connect(self.bus_options("gfair-up"))
            try:
                await bus.ensure_topology(cluster_topology(replicas=self.options.stream_replicas))
                self._spawn_all()
                self._watchdog = asyncio.create_task(self._watch(), name="gfair-up-watchdog")
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

    async def _start_brokers(self) -> str:
        """Start the embedded broker(s); their client URLs, comma-separated."""
        count = self.options.brokers
        if count == 1:
            return await self._start_single_broker()
        else:
            config_file, server_env = self._broker_auth()
            routes = tuple(f"nats://127.0.0.1:{_free_port()}" for _ in range(count))
            configs = [
                NatsServerConfig(
                    store_dir=self.data_dir / "nats" / f"n{index}",
                    server_name=f"gfair-n{index}",
                    cluster_name=BROKER_CLUSTER_NAME,
                    cluster_listen=routes[index],
                    routes=routes,
                    log_file=self.logs_dir / f"nats-server-{index}.log",
                    config_file=config_file,
                    env=server_env,
                    max_payload=self.options.max_payload,
                )
                for index in range(count)
            ]
        self._brokers = [EmbeddedNatsServer(config) for config in configs]
        urls = [await asyncio.to_thread(broker.start) for broker in self._brokers]
        return ",".join(urls)

    def _broker_auth(self) -> tuple[Path | None, dict[str, str]]:
        """The brokers' config file and environment: with `auth`, the rendered authorization
        and the passwords it reads; without, none."""
        if self.logins is None:
            return None, {}
        config = self.logins.write_auth_conf(self.auth_dir)
        return config, self.logins.server_env()

    async def _start_single_broker(self) -> str:
        config_file, server_env = self._broker_auth()
        preferred = self.options.preferred_port
        ports: list[int | None] = [None]
        if preferred is not None and _port_free(preferred):
            ports.insert(0, preferred)
        for port in ports:
            broker = EmbeddedNatsServer(
                NatsServerConfig(
                    store_dir=self.data_dir / "nats",
                    port=port,
                    log_file=self.logs_dir / "nats-server.log",
                    config_file=config_file,
                    env=server_env,
                    max_payload=self.options.max_payload,
                )
            )
            self._brokers = [broker]
            try:
                return await asyncio.to_thread(broker.start)
            except NatsServerError:
                # Someone took the preferred port since it was probed; any free one will do.
                if port is None:
                    raise
                _log.info("preferred port taken; using a free one", port=port)
        raise AssertionError("unreachable: the last attempt raises")

    async def kill_broker(self, index: int) -> None:
        """SIGKILL one of the brokers this cluster started, as a crash would."""
        await asyncio.to_thread(self._brokers[index].kill)
        _log.warning("broker killed", broker=index)

    async def restart_broker(self, index: int) -> None:
        """Start a stopped broker again on its ports, with its store (it catches up)."""
        await asyncio.to_thread(self._brokers[index].start)
        _log.info("broker restarted", broker=index)

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
        for child in self.children.values():
            child.start()

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
                waiting_nodes -= await self._registered_since(bus, self.started_at)
            if waiting_services:
                waiting_services -= await self._consuming(bus, waiting_services)
            if QUERY_SERVICE in waiting_services and await self._answering(bus):
                waiting_services.discard(QUERY_SERVICE)
            if time.monotonic() > deadline:
                missing = ", ".join(sorted(waiting_nodes | waiting_services))
                raise ClusterError(
                    f"cluster not ready within {self.options.ready_timeout_s:g}s; still "
                    f"waiting for {missing} (logs in {self.logs_dir})"
                )
            if waiting_nodes or waiting_services:
                await asyncio.sleep(0.1)

    async def _registered_since(self, bus: NatsBus, since: datetime) -> set[str]:
        found: set[str] = set()
        async for past in read_history(
            bus,
            NODES_STREAM.name,
            filter_subjects=(NodeRegistered.subject_pattern(),),
            accepts=(NodeRegistered,),
        ):
            if past.envelope.time >= since and isinstance(past.data, NodeRegistered):
                found.add(past.data.node_id)
        return found

    async def _answering(self, bus: NatsBus) -> bool:
        """Whether the query service answers (it has no consumer to look for)."""
        try:
            # As the operator: the service answers only on the inbox of the user it is asked
            # about, and this connection may read any inbox.
            await ask_query(bus.client, OPERATOR_USER, "nodes", b"{}", timeout_s=0.5)
        except (nats.errors.Error, TimeoutError):
            return False
        return True

    async def _consuming(
        self, bus: NatsBus, services: set[str], incarnation: datetime | None = None
    ) -> set[str]:
        """Services with a consumer that a live process is pulling from right now.

        With `incarnation` (when the process started), only its own pulls count: a delivery
        it acknowledged, or a pull waiting once the killed process's pulls have expired.
        """
        js = bus.client.jetstream()
        pulling: set[str] = set()
        expired = incarnation is not None and datetime.now(UTC) >= incarnation + _PULLS_EXPIRE
        for stream in STREAMS:
            try:
                consumers = await js.consumers_info(stream.name)
            except Exception:  # the stream may not have consumers yet
                continue
            for info in consumers:
                name = info.name or ""
                waiting = (info.num_waiting or 0) > 0
                if incarnation is None:
                    pulled = waiting or (info.num_ack_pending or 0) > 0
                else:
                    acked = info.ack_floor.last_active if info.ack_floor else None
                    pulled = (acked is not None and acked >= incarnation) or (waiting and expired)
                if pulled:
                    pulling.update(s for s in services if name.startswith(f"{s}-"))
        return pulling

    # -- keep children alive --------------------------------------------------------------------

    async def _watch(self) -> None:
        backoff: dict[str, float] = {}
        while not self._stopping:
            await asyncio.sleep(0.5)
            for child in self.children.values():
                if self._stopping or child.alive or child.process is None or child.exit_seen:
                    continue
                child.exit_seen = True
                code = child.process.returncode
                if child.kills:
                    child.kills -= 1
                else:
                    child.crashes.append(code)
                    _log.warning(
                        "child exited", child=child.name, code=code, log=str(child.log_path)
                    )
                if child.held or not self.options.restart_children:
                    continue
                delay = backoff.get(child.name, 0.5)
                backoff[child.name] = min(delay * 2, 30.0)
                await asyncio.sleep(delay)
                if not self._stopping:
                    child.start()
                    _log.info("child restarted", child=child.name, pid=child.pid)

    def kill(self, name: str, *, restart: bool = True) -> None:
        """SIGKILL one child, as a crash would; the watchdog restarts it (not a crash).

        With `restart=False` it stays down (a node that is gone) until `revive(name)`.
        """
        child = self.children[name]
        if child.alive:
            child.kills += 1
            child.held = not restart
            child.signal(signal.SIGKILL)

    def kill_node(self, node_id: str) -> int:
        """The server dies: SIGKILL its executor (left down until `revive`) and its jobs.

        Job processes run in sessions of their own and would outlive their executor; on a
        dead server they die with it. Returns how many job processes were killed (Linux:
        found through /proc by the control directory the executor gave them).
        """
        if self.options.virtual:
            raise ClusterError("virtual nodes share processes: none can be killed alone")
        self.kill(node_id, restart=False)
        killed = self._kill_marked((node_id,))
        _log.warning("node killed", node=node_id, jobs_killed=killed)
        return killed

    def _kill_marked(self, node_ids: Sequence[str]) -> int:
        """SIGKILL every process carrying the control-directory marker of one of `node_ids`'
        executors (one pass over /proc); how many."""
        markers = tuple(
            f"{ENV_CONTROL_DIR}={self.node_work_root(node_id)}/".encode() for node_id in node_ids
        )
        killed = 0
        for pid in _pids_with_environ(markers):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        return killed

    def _stop_jobs(self) -> int:
        """Kill every job the executors left: one that ignored its drain past the stop grace
        (its executor was killed before it could), and whatever such a job started. Through
        the jobs' cgroups (v2, then the v1 ones of their limits), then their marker; returns
        how many processes were found."""
        setting = {**os.environ, **self.options.env}.get("GFAIR_JOB_CGROUPS", AUTO).strip() or AUTO
        try:
            base = locate(setting)
        except CgroupError:
            base = None
        legacy = v1_hierarchies()
        found = 0
        for node_id in self.node_ids:
            work_root = self.node_work_root(node_id)
            if base is not None:
                found += len(sweep_node(base, node_id, work_root))
            for hierarchy in set(legacy.values()):
                found += len(kill_legacy(hierarchy / node_directory(node_id, work_root)))
        found += self._kill_marked(self.node_ids)
        if found:
            _log.warning("killed jobs their executors left running", processes=found)
        return found

    def _event_id_key(self) -> str:
        # Read once: every child of this cluster (restarts too) derives with the same key.
        if self._event_key is None:
            self._event_key = event_id_key(self.data_dir / EVENT_ID_KEY_FILE)
        return self._event_key

    def node_work_root(self, node_id: str) -> Path:
        return self.data_dir / "nodes" / node_id

    def revive(self, name: str) -> None:
        """Start again a child killed with `restart=False` (a lost node coming back)."""
        child = self.children[name]
        child.held = False
        if not child.alive and not self._stopping:
            child.start()
            _log.info("child revived", child=child.name, pid=child.pid)

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
                        if name in await self._registered_since(bus, since):
                            break
                    elif child.module == QUERY_SERVICE:
                        if await self._answering(bus):
                            break
                    elif await self._consuming(bus, {name.replace("_", "-")}, restarted):
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
        self._stopping = True
        # First, so that no tool finds a cluster that is going away.
        remove_context(self.context_files, os.getpid())
        self.context_files = ()
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None
        await self._stop_children(list(self.children.values()))
        await asyncio.to_thread(self._stop_jobs)
        for broker in self._brokers:
            await asyncio.to_thread(broker.stop)
        self._brokers = []
        if self.logins is not None:
            self.logins.remove_logins(self.auth_dir)

    async def _stop_children(self, children: Sequence[Child]) -> None:
        for child in children:
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.options.stop_grace_s
        while time.monotonic() < deadline:
            if not any(c.alive for c in children):
                break
            await asyncio.sleep(0.05)
        for child in children:
            if child.alive:
                _log.warning("child ignored SIGTERM; killing it", child=child.name)
                child.signal(signal.SIGKILL)
        for child in children:
            if child.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(child.process.wait, 5.0)
            child.close_log()


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


def _free_port() -> int:
    """A port free right now, for a broker's cluster routes (which must be known up front)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nats-server could listen on `port` now (it sets SO_REUSEADDR, so does this)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True


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


def _pids_with_environ(markers: tuple[bytes, ...]) -> list[int]:
    """Processes whose environment holds one of `markers` (``NAME=value`` prefixes); Linux
    only."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if any(item.startswith(markers) for item in environ.split(b"\0")):
            found.append(int(entry.name))
    return found
