"""gfair.client: the async Python client tools use to talk to a gfair cluster."""

from gfair.client.client import GfairClient, InvalidRequest, WaitFor
from gfair.client.cluster_context import (
    ClusterAddress,
    ClusterContext,
    locate_cluster,
    running_context,
)
from gfair.client.connection import (
    DEFAULT_NATS_URL,
    NATS_URL_ENV,
    ConnectOptions,
    connect_bus,
    default_servers,
)
from gfair.client.errors import ClientError, NoCluster, NotReachable, UnknownJob, WaitTimeout
from gfair.client.explanation import Explanation, Reason
from gfair.client.views import JobDetails, PoolUsage, Submitted, UserSummary, UsersView

__all__ = [
    "DEFAULT_NATS_URL",
    "NATS_URL_ENV",
    "ClientError",
    "ClusterAddress",
    "ClusterContext",
    "ConnectOptions",
    "Explanation",
    "GfairClient",
    "InvalidRequest",
    "JobDetails",
    "NoCluster",
    "NotReachable",
    "PoolUsage",
    "Reason",
    "Submitted",
    "UnknownJob",
    "UserSummary",
    "UsersView",
    "WaitFor",
    "WaitTimeout",
    "connect_bus",
    "default_servers",
    "locate_cluster",
    "running_context",
]
