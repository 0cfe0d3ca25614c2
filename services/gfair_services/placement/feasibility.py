"""Whether a job could ever run on the registered nodes: the core's admission filters
(`placement.filter_pools`: its type fits the generation, its gang fits the pool), as the
simulator's driver applies them.

Where and when an admitted job runs is the decision kernel's, each quantum (split-stride); this
only keeps out the jobs no quantum could ever run.
"""

from __future__ import annotations

from gfair.core.placement import PoolView, filter_pools, rejection_reason
from gfair.core.throughput import ThroughputEstimator
from gfair_services.inventory import NodeInventory


def unsatisfiable(
    gpus: int, job_type: str | None, inventory: NodeInventory, estimator: ThroughputEstimator
) -> str | None:
    """Why no registered pool could ever run the job (None: one could, or none is known yet:
    a cluster still coming up accepts and waits)."""
    pools = inventory.pools(ready_only=False)
    if not pools:
        return None
    views = [
        PoolView(pool, 1.0 if estimator.fits(job_type, generation) else 0.0)
        for generation, pool in pools.items()
    ]
    admitted = filter_pools(gpus, job_type, views)
    return None if admitted.accepted else rejection_reason(gpus, views, admitted.rejections)
