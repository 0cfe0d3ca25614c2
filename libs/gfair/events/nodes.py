"""Events of a GPU server's life, on `gfair.node.<node_id>.<event>`.

The `<event>` token is the verb of the event type (`gfair.node.heartbeat.v1` -> `heartbeat`).
The node executor publishes registered, heartbeat and telemetry; the failure detector publishes
suspected, failed, recovered and quarantined; an operator's tool publishes uncordoned.
"""

from __future__ import annotations

from typing import ClassVar, Self

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from gfair.events.envelope import EventData
from gfair.events.fields import (
    Bytes,
    Generation,
    GpuIndex,
    JobRefs,
    Name,
    NodeId,
    PositiveSeconds,
    Reason,
    XidCode,
    require_unique,
)
from gfair.events.registry import register
from gfair.events.states import NodeState
from gfair.events.subjects import PREFIX, node_subject

MAX_GPUS_PER_NODE = 256


class NodeEvent(EventData):
    """Base of every event about one node; `node_id` places it in the subject."""

    # The state the node is in after this event; None when the event does not move it.
    NODE_STATE: ClassVar[NodeState | None] = None

    node_id: NodeId

    @classmethod
    def event_name(cls) -> str:
        return cls.EVENT_TYPE.split(".")[2]

    def subject(self) -> str:
        return node_subject(self.node_id, self.event_name())

    @classmethod
    def subject_pattern(cls) -> str:
        return f"{PREFIX}.node.*.{cls.event_name()}"


class GpuInfo(BaseModel):
    """One GPU of a server, as NVML (or the GPU simulator) reports it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    index: GpuIndex
    uuid: str = Field(min_length=1, max_length=128, description="NVML UUID, e.g. GPU-8f6c...")
    name: Name = Field(description="Marketing name, e.g. 'NVIDIA H100 80GB HBM3'")
    generation: Generation
    memory_bytes: int = Field(gt=0, description="Total device memory")


class GpuSample(BaseModel):
    """One GPU's health and load at one instant."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    index: GpuIndex
    utilization_pct: float = Field(ge=0, le=100, allow_inf_nan=False)
    memory_used_bytes: Bytes
    temperature_c: float = Field(ge=-50, le=200, allow_inf_nan=False)
    power_w: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    xid_events: tuple[XidCode, ...] = Field(
        default=(), description="NVML XID errors since the previous sample"
    )


@register
class NodeRegistered(NodeEvent):
    """A node executor came up and offers its GPUs."""

    EVENT_TYPE = "gfair.node.registered.v1"
    NODE_STATE = NodeState.READY

    hostname: str = Field(min_length=1, max_length=255)
    gpus: tuple[GpuInfo, ...] = Field(min_length=1, max_length=MAX_GPUS_PER_NODE)
    heartbeat_interval_s: PositiveSeconds = Field(description="How often it will heartbeat")
    simulated: bool = Field(default=False, description="GPUs are simulated, not real")
    executor_version: str | None = Field(default=None, max_length=64)

    @model_validator(mode="after")
    def _distinct_gpus(self) -> Self:
        try:
            require_unique([gpu.index for gpu in self.gpus])
            require_unique([gpu.uuid for gpu in self.gpus])
        except ValueError as error:
            raise ValueError(f"GPUs must be distinct: {error}") from None
        return self

    @property
    def generations(self) -> frozenset[str]:
        return frozenset(gpu.generation for gpu in self.gpus)


@register
class NodeHeartbeat(NodeEvent):
    """I am alive, and these are the jobs I am running."""

    EVENT_TYPE = "gfair.node.heartbeat.v1"

    seq: int = Field(ge=0, description="Counts up from 0 each time the executor starts")
    running: JobRefs = Field(default=(), description="Jobs whose processes run here now")
    fault: Reason | None = Field(
        default=None,
        description="What keeps this node from running its jobs though it is alive (its "
        "container engine unreachable, say): it is failed and its jobs re-placed until a "
        "heartbeat without one",
    )


@register
class NodeTelemetry(NodeEvent):
    """Per-GPU utilization, memory, temperature and XID errors."""

    EVENT_TYPE = "gfair.node.telemetry.v1"

    gpus: tuple[GpuSample, ...] = Field(min_length=1, max_length=MAX_GPUS_PER_NODE)

    @model_validator(mode="after")
    def _distinct_gpus(self) -> Self:
        try:
            require_unique([gpu.index for gpu in self.gpus])
        except ValueError as error:
            raise ValueError(f"GPU samples must be distinct: {error}") from None
        return self


@register
class NodeSuspected(NodeEvent):
    """Missed heartbeats: no new work goes there; its jobs are not re-placed yet."""

    EVENT_TYPE = "gfair.node.suspected.v1"
    NODE_STATE = NodeState.SUSPECTED

    missed_heartbeats: int = Field(ge=1)
    last_heartbeat: AwareDatetime | None = None


@register
class NodeFailed(NodeEvent):
    """Declared dead: `jobs` are re-placed and resume from their last checkpoints."""

    EVENT_TYPE = "gfair.node.failed.v1"
    NODE_STATE = NodeState.FAILED

    reason: Reason
    last_heartbeat: AwareDatetime | None = None
    jobs: JobRefs = Field(default=(), description="Jobs that were running there")


@register
class NodeRecovered(NodeEvent):
    """Heartbeats are back after a suspicion or failure."""

    EVENT_TYPE = "gfair.node.recovered.v1"
    NODE_STATE = NodeState.READY

    reason: Reason | None = None


@register
class NodeQuarantined(NodeEvent):
    """Kept failing jobs: no work until an operator uncordons it."""

    EVENT_TYPE = "gfair.node.quarantined.v1"
    NODE_STATE = NodeState.QUARANTINED

    reason: Reason
    recent_failures: int = Field(ge=0, description="Infrastructure failures in the window")


@register
class NodeUncordoned(NodeEvent):
    """An operator cleared a quarantine."""

    EVENT_TYPE = "gfair.node.uncordoned.v1"
    NODE_STATE = NodeState.READY

    operator: str | None = Field(default=None, min_length=1, max_length=256)
    reason: Reason | None = None
