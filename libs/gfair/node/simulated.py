"""Simulated GPUs, for machines without NVIDIA GPUs (CI, laptops, demos of a whole cluster).

A spec such as `v100:4,k80:2` gives a node four V100s (indices 0-3) and two K80s (4-5). Each
simulated GPU reports plausible telemetry that is a pure function of the sequence of samples and
of which GPUs were busy: utilisation and memory follow whether a job runs on the GPU, temperature
drifts towards a busy or idle level, power follows utilisation.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass

from gfair.node.generation import generation_of
from gfair.node.gpu import GpuDevice, GpuReading, XidError

_GIB = 1024**3
_SPEC_ENTRY = re.compile(r"^([A-Za-z0-9_-]+):(\d+)$")
_UUID_NAMESPACE = uuid.UUID("5b0c2f1e-8d0a-4c55-9a55-6766616972a1")


@dataclass(frozen=True, slots=True)
class SimulatedModel:
    name: str
    memory_total_bytes: int
    idle_power_w: float
    max_power_w: float


# Names as NVML reports them (so generation_of maps them back), board memory and power limits.
MODELS: dict[str, SimulatedModel] = {
    "k80": SimulatedModel("Tesla K80", 12 * _GIB, 26.0, 149.0),
    "p100": SimulatedModel("Tesla P100-PCIE-16GB", 16 * _GIB, 28.0, 250.0),
    "v100": SimulatedModel("Tesla V100-SXM2-16GB", 16 * _GIB, 40.0, 300.0),
    "a100": SimulatedModel("NVIDIA A100-SXM4-80GB", 80 * _GIB, 55.0, 400.0),
    "h100": SimulatedModel("NVIDIA H100 80GB HBM3", 80 * _GIB, 70.0, 700.0),
    "h200": SimulatedModel("NVIDIA H200", 141 * _GIB, 75.0, 700.0),
}
_GENERIC = SimulatedModel("Simulated GPU", 16 * _GIB, 30.0, 250.0)

_IDLE_TEMP_C, _BUSY_TEMP_C = 34.0, 72.0
# Fraction of the gap to the target temperature closed per sample: a few samples to warm up.
_TEMP_RESPONSE = 0.3
_BUSY_MEMORY_FRACTION = 0.7


def parse_gpu_spec(spec: str) -> list[tuple[str, int]]:
    """'v100:4,k80:2' -> [('v100', 4), ('k80', 2)]; a clear ValueError otherwise."""
    entries: list[tuple[str, int]] = []
    for raw in spec.split(","):
        entry = raw.strip()
        match = _SPEC_ENTRY.match(entry)
        if match is None:
            raise ValueError(
                f"bad GPU spec entry {entry!r} in {spec!r}: expected GENERATION:COUNT, e.g. v100:4"
            )
        generation, count = match.group(1).lower(), int(match.group(2))
        if count < 1:
            raise ValueError(f"bad GPU spec entry {entry!r}: count must be at least 1")
        entries.append((generation, count))
    return entries


class SimulatedGpus:
    """GpuBackend for GPUs that do not exist. `node_id` makes UUIDs unique per node."""

    def __init__(
        self, spec: str, *, node_id: str = "local", clock: Callable[[], float] = time.time
    ) -> None:
        self._clock = clock
        self._inventory: list[GpuDevice] = []
        self._models: list[SimulatedModel] = []
        for generation, count in parse_gpu_spec(spec):
            known = MODELS.get(generation)
            model = known or SimulatedModel(
                f"{_GENERIC.name} {generation.upper()}",
                _GENERIC.memory_total_bytes,
                _GENERIC.idle_power_w,
                _GENERIC.max_power_w,
            )
            for _ in range(count):
                index = len(self._inventory)
                device_uuid = uuid.uuid5(_UUID_NAMESPACE, f"{node_id}/{index}/{generation}")
                self._inventory.append(
                    GpuDevice(
                        index=index,
                        uuid=f"GPU-{device_uuid}",
                        name=model.name,
                        generation=generation_of(model.name) if known else generation,
                        memory_total_bytes=model.memory_total_bytes,
                        simulated=True,
                    )
                )
                self._models.append(model)
        self._samples_taken = 0
        self._temperature = [_IDLE_TEMP_C + 0.5 * g.index for g in self._inventory]
        self._pending_xids: list[XidError] = []

    def inventory(self) -> Sequence[GpuDevice]:
        return list(self._inventory)

    def sample(self, busy: Set[int]) -> list[GpuReading]:
        now = self._clock()
        tick = self._samples_taken
        self._samples_taken += 1
        samples = []
        for info, model in zip(self._inventory, self._models, strict=True):
            running = info.index in busy
            # A small deterministic wobble so charts do not show flat lines.
            wobble = ((tick * 7 + info.index * 3) % 5) / 4.0  # 0.0 .. 1.0
            utilization = 92.0 + 6.0 * wobble if running else 0.0
            memory = (
                int(model.memory_total_bytes * (_BUSY_MEMORY_FRACTION + 0.05 * wobble))
                if running
                else 0
            )
            target = _BUSY_TEMP_C if running else _IDLE_TEMP_C
            temp = self._temperature[info.index]
            temp += (target - temp) * _TEMP_RESPONSE
            self._temperature[info.index] = temp
            power = model.idle_power_w + (model.max_power_w - model.idle_power_w) * (
                0.9 * utilization / 100.0
            )
            samples.append(
                GpuReading(
                    index=info.index,
                    uuid=info.uuid,
                    time=now,
                    utilization_pct=utilization,
                    memory_used_bytes=memory,
                    temperature_c=round(temp, 1),
                    power_w=round(power, 1),
                )
            )
        return samples

    def inject_xid(self, index: int, xid: int) -> None:
        """Make the next poll report an XID error on GPU `index` (fault-injection for tests)."""
        info = self._inventory[index]
        self._pending_xids.append(XidError(index, info.uuid, xid, self._clock()))

    def poll_xid_errors(self) -> list[XidError]:
        errors, self._pending_xids = self._pending_xids, []
        return errors

    def compute_processes(self, indices: Sequence[int]) -> int | None:
        del indices
        return 0  # nothing runs on a GPU that does not exist

    def close(self) -> None:
        pass
