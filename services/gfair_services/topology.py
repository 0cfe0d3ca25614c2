"""Everything a gfair cluster needs on the bus: the contract's streams and the state buckets.

Every service declares the whole of it, so the first process to start creates it and the
others find it; `Bus.ensure_topology` makes repeats free. They must therefore agree on how it
is replicated: each one reads the same ``GFAIR_REPLICAS`` (`TopologySettings`), 1 for
`gfair up` on one broker, 3 on a three-broker JetStream cluster, where a stream or bucket
survives the loss of any one broker. A process that declared fewer replicas would scale the
streams down, since declaring an existing stream updates it.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gfair.bus.job_output import (
    DEFAULT_MAX_AGE_S,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_MSGS_PER_SUBJECT,
    job_output_stream,
)
from gfair.bus.topology import BucketSpec, Storage, Topology, contract_streams
from gfair.state import buckets

# Handlers take milliseconds (and the runtime keeps a long one alive with progress signals), so
# a short ack wait only bounds how long a SIGKILLed service sits on its in-flight events before
# the restarted one gets them again.
DEFAULT_ACK_WAIT_S = 5.0
# JetStream allows at most 5 replicas of a stream.
MAX_REPLICAS = 5


class TopologySettings(BaseSettings):
    """How a service's streams, buckets and consumers are set up; a service `Settings` mixin."""

    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

    replicas: int = Field(
        default=1,
        ge=1,
        le=MAX_REPLICAS,
        description="JetStream replicas of every stream and bucket (3 on a 3-broker cluster)",
    )
    ack_wait_s: float = Field(
        default=DEFAULT_ACK_WAIT_S,
        gt=0,
        description="How soon a crashed instance's unacknowledged events are redelivered",
    )
    logs_max_age_s: float = Field(
        default=DEFAULT_MAX_AGE_S, gt=0, description="Jobs' output older than this is dropped"
    )
    logs_max_bytes: int = Field(
        default=DEFAULT_MAX_BYTES,
        gt=0,
        description="Jobs' output kept in all, oldest dropped first (GFAIR_LOGS stream)",
    )
    logs_max_msgs_per_subject: int = Field(
        default=DEFAULT_MAX_MSGS_PER_SUBJECT,
        gt=0,
        description="Chunks of output kept per job, output and node, oldest dropped first: a "
        "job that floods its output pushes out its own, not other jobs' (GFAIR_LOGS stream)",
    )


def cluster_buckets(
    *, storage: Storage = Storage.FILE, replicas: int | None = None
) -> tuple[BucketSpec, ...]:
    """The buckets of `gfair.state.buckets`; `replicas` defaults to ``GFAIR_REPLICAS``."""
    count = TopologySettings().replicas if replicas is None else replicas
    return tuple(
        BucketSpec(
            name=bucket.name,
            description=f"{bucket.holds} (written by {bucket.writer})",
            storage=storage,
            replicas=count,
        )
        for bucket in buckets.ALL
    )


def cluster_topology(*, storage: Storage = Storage.FILE, replicas: int | None = None) -> Topology:
    """Streams of the event contract (dead letters included), the jobs' output stream and the
    buckets of `state`.

    `replicas` defaults to ``GFAIR_REPLICAS`` (1 when unset), so a process that does not pass
    a value of its own (the node executor) declares the same topology as those that do; the
    output's retention is ``GFAIR_LOGS_MAX_AGE_S`` and ``GFAIR_LOGS_MAX_BYTES``.
    """
    settings = TopologySettings()
    count = settings.replicas if replicas is None else replicas
    logs = job_output_stream(
        replicas=count,
        storage=storage,
        max_age_s=settings.logs_max_age_s,
        max_bytes=settings.logs_max_bytes,
        max_msgs_per_subject=settings.logs_max_msgs_per_subject,
    )
    return Topology(
        streams=(*contract_streams(storage=storage, replicas=count), logs),
        buckets=cluster_buckets(storage=storage, replicas=count),
    )
