"""What a node knows about its GPUs: inventory, telemetry samples and XID errors.

Two backends satisfy `GpuBackend`: NVML on a real machine (`gfair.node.nvml`) and simulated
GPUs (`gfair.node.simulated`). Backends are synchronous (NVML calls take microseconds to a few
milliseconds); `gfair.node.telemetry` runs them off the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class NoGpusError(RuntimeError):
    """This node cannot see any GPU (no driver, no NVML, or zero devices)."""


@dataclass(frozen=True, slots=True)
class GpuDevice:
    index: int
    uuid: str
    name: str
    generation: str
    memory_total_bytes: int
    simulated: bool
    # Its device node (/dev/nvidia<minor>), which a job of another GPU must not open; None:
    # unknown (a simulated GPU without one).
    device: Path | None = None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One reading of one GPU; a field is None where the device does not support it."""

    index: int
    uuid: str
    time: float
    utilization_pct: float | None
    memory_used_bytes: int | None
    temperature_c: float | None
    power_w: float | None
    # Set when the device could not be read at all (e.g. "GPU is lost"): a node-health signal.
    error: str | None = None


@dataclass(frozen=True, slots=True)
class XidError:
    """A critical XID event (a GPU or driver fault that usually kills the job on that GPU)."""

    index: int | None
    uuid: str | None
    xid: int
    time: float


class GpuBackend(Protocol):
    def inventory(self) -> Sequence[GpuDevice]:
        """The node's GPUs, in index order (the order CUDA_VISIBLE_DEVICES indices refer to)."""
        ...

    def sample(self, busy: Set[int]) -> list[GpuReading]:
        """Read every GPU once; `busy` are the indices jobs run on (used by simulated GPUs)."""
        ...

    def poll_xid_errors(self) -> list[XidError]:
        """XID errors since the last poll; never blocks."""
        ...

    def compute_processes(self, indices: Sequence[int]) -> int | None:
        """How many processes hold a compute context (GPU memory) on these GPUs; None when
        the GPUs cannot tell."""
        ...

    def close(self) -> None: ...
