"""The cluster as the node events describe it: which servers exist, their GPUs, their health.

The cluster is whatever node executors registered, not a static spec. Placement and
split-stride fold the same node events into a `NodeInventory`:

- `NodeRegistered` gives a node's GPUs (and makes it ready, unless an operator's quarantine is
  still in force: restarting an executor does not clear a quarantine);
- the failure detector's verdicts move its state (suspected, failed, recovered, quarantined;
  an operator's uncordon ends a quarantine).

Events may be folded twice (history read at start, then the durable consumer's redeliveries) and
verdicts come from different producers, so a node's state only moves on an event at least as new
as the one that last moved it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime

import structlog

from gfair.core.cluster import Cluster, Server
from gfair.core.pools import Pool, pools_of
from gfair.core.scheduler import Node, NodeHealth
from gfair.events.envelope import Envelope
from gfair.events.nodes import (
    NodeEvent,
    NodeFailed,
    NodeQuarantined,
    NodeRecovered,
    NodeRegistered,
    NodeSuspected,
    NodeUncordoned,
)
from gfair.events.states import NodeState

_log = structlog.get_logger("gfair.inventory")

# The node events that change what the inventory says (heartbeats and telemetry do not).
INVENTORY_EVENTS: tuple[type[NodeEvent], ...] = (
    NodeRegistered,
    NodeSuspected,
    NodeFailed,
    NodeRecovered,
    NodeQuarantined,
    NodeUncordoned,
)


@dataclass(frozen=True, slots=True)
class NodeEntry:
    node_id: str
    generation: str
    gpu_indices: tuple[int, ...]
    state: NodeState
    changed_at: datetime
    hostname: str | None = None  # where its jobs are reached (a gang's first part listens)

    @property
    def gpus(self) -> int:
        return len(self.gpu_indices)

    @property
    def health(self) -> NodeHealth:
        """Its state as the scheduling core reads it (which states take work is the core's)."""
        return NodeHealth(self.state.value)

    @property
    def takes_new_work(self) -> bool:
        return self.health.takes_new_work

    @property
    def schedulable(self) -> bool:
        return self.health.schedulable

    def server(self) -> Server:
        return Server(self.node_id, self.generation, self.gpus)

    def node(self) -> Node:
        """The node as split stride's state machine is told of it."""
        return Node(self.node_id, self.generation, self.gpu_indices, self.health)


@dataclass(frozen=True, slots=True)
class NodeChange:
    node_id: str
    before: NodeState | None  # None: it was not known
    after: NodeState


def _allowed(before: NodeState, event: NodeEvent) -> NodeState | None:
    """The state `event` moves a node in `before` to, or None when it does not apply."""
    match event:
        case NodeRegistered():
            return before if before is NodeState.QUARANTINED else NodeState.READY
        case NodeSuspected():
            return NodeState.SUSPECTED if before is NodeState.READY else None
        case NodeFailed():
            return NodeState.FAILED if before is not NodeState.QUARANTINED else None
        case NodeRecovered():
            return NodeState.READY if before in (NodeState.SUSPECTED, NodeState.FAILED) else None
        case NodeQuarantined():
            return NodeState.QUARANTINED
        case NodeUncordoned():
            return NodeState.READY if before is NodeState.QUARANTINED else None
    return None


def node_gpus(event: NodeRegistered) -> tuple[str, tuple[int, ...]]:
    """A node's generation (its most common one) and the indices of its GPUs of it."""
    counts = Counter(gpu.generation for gpu in event.gpus)
    generation = max(sorted(counts), key=lambda g: counts[g])
    indices = tuple(sorted(gpu.index for gpu in event.gpus if gpu.generation == generation))
    if len(counts) > 1:
        _log.warning(
            "node mixes GPU generations; only the most common is scheduled",
            node_id=event.node_id,
            generations=dict(counts),
            scheduled=generation,
        )
    return generation, indices


class NodeInventory:
    def __init__(self, entries: Iterable[NodeEntry] = ()) -> None:
        self._nodes: dict[str, NodeEntry] = {e.node_id: e for e in entries}

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    @property
    def nodes(self) -> Mapping[str, NodeEntry]:
        return self._nodes

    def get(self, node_id: str) -> NodeEntry | None:
        return self._nodes.get(node_id)

    def apply(self, envelope: Envelope, event: NodeEvent) -> NodeChange | None:
        """Fold one node event in; the change it made, or None."""
        at = envelope.time
        entry = self._nodes.get(event.node_id)
        if isinstance(event, NodeRegistered):
            try:
                generation, indices = node_gpus(event)
                Server(event.node_id, generation, len(indices))
            except ValueError as error:
                _log.warning("ignoring node registration", node_id=event.node_id, error=str(error))
                return None
            if entry is None:
                self._nodes[event.node_id] = NodeEntry(
                    event.node_id, generation, indices, NodeState.READY, at, event.hostname
                )
                return NodeChange(event.node_id, None, NodeState.READY)
            if at < entry.changed_at:
                return None
            state = _allowed(entry.state, event) or entry.state
            self._nodes[event.node_id] = NodeEntry(
                event.node_id, generation, indices, state, at, event.hostname
            )
            if state is entry.state and (generation, indices) == (
                entry.generation,
                entry.gpu_indices,
            ):
                return None
            return NodeChange(event.node_id, entry.state, state)
        if entry is None or at < entry.changed_at:
            return None
        after = _allowed(entry.state, event)
        if after is None or after is entry.state:
            return None
        self._nodes[event.node_id] = replace(entry, state=after, changed_at=at)
        return NodeChange(event.node_id, entry.state, after)

    def ready(self) -> list[NodeEntry]:
        return [e for e in self._nodes.values() if e.takes_new_work]

    def pools(self, *, ready_only: bool = True) -> dict[str, Pool]:
        """Generation -> pool of the (ready) nodes, slowest generation first."""
        entries = self.ready() if ready_only else list(self._nodes.values())
        return pools_of(Cluster.of(sorted((e.server() for e in entries), key=lambda s: s.id)))
