"""Everything a gfair cluster needs on the bus: the contract's streams and the state buckets.

Every service declares the whole of it, so the first process to start creates it and the
others find it; `Bus.ensure_topology` makes repeats free.
"""

from __future__ import annotations

from gfair.bus.topology import BucketSpec, Storage, Topology, contract_streams
from gfair.state import buckets


def cluster_buckets(
    *, storage: Storage = Storage.FILE, replicas: int = 1
) -> tuple[BucketSpec, ...]:
    return tuple(
        BucketSpec(
            name=bucket.name,
            description=f"{bucket.holds} (written by {bucket.writer})",
            storage=storage,
            replicas=replicas,
        )
        for bucket in buckets.ALL
    )


def cluster_topology(*, storage: Storage = Storage.FILE, replicas: int = 1) -> Topology:
    """Streams of the event contract (dead letters included) and the buckets of `state`."""
    return Topology(
        streams=contract_streams(storage=storage, replicas=replicas),
        buckets=cluster_buckets(storage=storage, replicas=replicas),
    )
