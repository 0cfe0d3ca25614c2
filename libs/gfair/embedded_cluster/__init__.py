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

from .brokers import Brokers
from .children import Child, Children
from .cluster import (
    EVENT_ID_KEY_FILE,
    NODE_EXECUTOR,
    ClusterError,
    EmbeddedCluster,
    event_id_key,
    interpreter_first,
    virtual_nodes_child,
)
from .options import QUERY_SERVICE, SCHEDULER_SERVICES, ClusterOptions

__all__ = [
    "EVENT_ID_KEY_FILE",
    "NODE_EXECUTOR",
    "QUERY_SERVICE",
    "SCHEDULER_SERVICES",
    "Brokers",
    "Child",
    "Children",
    "ClusterError",
    "ClusterOptions",
    "EmbeddedCluster",
    "event_id_key",
    "interpreter_first",
    "virtual_nodes_child",
]
