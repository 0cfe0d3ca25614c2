"""What an embedded cluster runs: its servers, services, brokers and settings (`ClusterOptions`)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gfair.cluster_logins import AUTH_DIR, load_embedded_tenants
from gfair.core.cluster import Cluster, parse_cluster_spec
from gfair.node.discovery import LOCAL_CLUSTER, local_cluster_spec
from gfair.node.gpu import NoGpusError
from gfair.node.nvml import SIMULATE_HINT
from gfair.tenancy import Tenants, TenantsError
from gfair_services.node_executor.settings import DEFAULT_VIRTUAL_NODES_PER_PROCESS
from gfair_services.topology import MAX_REPLICAS

# Scheduler services, in start order (node executors come after them, one per server).
SCHEDULER_SERVICES: tuple[str, ...] = (
    "failure_detector",
    "profiler",
    "trading_auction",
    "placement",
    "split_stride",
)
# Tenants' reads; it decides nothing and consumes no stream.
QUERY_SERVICE = "query"


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
