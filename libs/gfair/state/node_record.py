"""What the cluster knows about each node: one `NodeRecord` per node in `gfair_nodes`.

Written only by the failure detector (key: the node id); read by `gfair nodes`, `gfair why` and
any service that wants the inventory or the health of a node without replaying its events.
"""

from __future__ import annotations

from pydantic import AwareDatetime, Field

from gfair.events.fields import JobRefs, NodeId, Reason
from gfair.events.nodes import GpuInfo
from gfair.events.reasons import FailureClass
from gfair.events.states import NodeState
from gfair.state.buckets import NODES
from gfair.state.record import Record

BUCKET = NODES.name
# Enough to explain the last few hours of a node in `gfair nodes`, small enough for one KV value.
MAX_TRANSITIONS_KEPT = 20
MAX_FAILURES_KEPT = 50


def node_key(node_id: str) -> str:
    return node_id


class NodeFailureEntry(Record):
    """One failure held against the node (counted by the quarantine policy)."""

    time: AwareDatetime
    failure_class: FailureClass
    reason: Reason
    user: str | None = None
    job_id: str | None = None


class NodeTransition(Record):
    """A change of the node's state, with the reason the failure detector gave."""

    time: AwareDatetime
    state: NodeState
    reason: Reason


class NodeRecord(Record):
    node_id: NodeId
    state: NodeState
    state_since: AwareDatetime
    reason: str | None = Field(default=None, description="Why the node is in its state")
    hostname: str | None = None
    gpus: tuple[GpuInfo, ...] = ()
    simulated: bool = False
    executor_version: str | None = None
    heartbeat_interval_s: float | None = None
    registered_at: AwareDatetime | None = None
    # Written at most every few heartbeats (the detector keeps the exact time in memory).
    last_heartbeat: AwareDatetime | None = None
    heartbeat_seq: int | None = None
    running: JobRefs = Field(default=(), description="Jobs running there per its last heartbeat")
    # Quarantine outlives liveness: a quarantined node that dies and comes back is still
    # quarantined, so it is a flag beside the state (the state says QUARANTINED while alive).
    quarantined: bool = False
    quarantine_reason: str | None = None
    quarantined_at: AwareDatetime | None = None
    uncordoned_at: AwareDatetime | None = None
    uncordoned_by: str | None = None
    # Failures within the quarantine window (older ones and those before an uncordon dropped).
    recent_failures: tuple[NodeFailureEntry, ...] = ()
    # Every failure ever held against the node, by class.
    failure_counts: dict[FailureClass, int] = Field(default_factory=dict)
    transitions: tuple[NodeTransition, ...] = ()

    @property
    def generations(self) -> frozenset[str]:
        return frozenset(gpu.generation for gpu in self.gpus)

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def schedulable(self) -> bool:
        """Whether new work may go there."""
        return self.state is NodeState.READY and not self.quarantined


__all__ = [
    "BUCKET",
    "MAX_FAILURES_KEPT",
    "MAX_TRANSITIONS_KEPT",
    "NodeFailureEntry",
    "NodeRecord",
    "NodeTransition",
    "node_key",
]
