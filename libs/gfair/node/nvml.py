"""Real GPUs through NVML (`pynvml`, from the nvidia-ml-py package).

The module object is passed in (`NvmlGpus(pynvml)`) so tests can hand over a fake NVML and the
code paths run without a driver.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence, Set
from pathlib import Path
from typing import Any, Protocol

from gfair.node.generation import generation_of
from gfair.node.gpu import GpuDevice, GpuReading, NoGpusError, XidError

SIMULATE_HINT = "pass --simulate-gpus GENERATION:COUNT (e.g. --simulate-gpus v100:4) to simulate"
# Bound one poll so a storm of events cannot pin the telemetry loop.
_MAX_EVENTS_PER_POLL = 1024


class NvmlApi(Protocol):
    """The part of pynvml this backend uses."""

    # Read-only, so that both the module and a test double's class attributes match.
    @property
    def NVMLError(self) -> type[Exception]: ...
    @property
    def NVMLError_NotSupported(self) -> type[Exception]: ...
    @property
    def NVML_TEMPERATURE_GPU(self) -> int: ...
    @property
    def nvmlEventTypeXidCriticalError(self) -> int: ...

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Sequence[Any]: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None: ...
    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any: ...
    def nvmlEventSetFree(self, event_set: Any) -> None: ...


class NvmlGpus:
    """GpuBackend over NVML. Construction initialises NVML; `close` shuts it down."""

    def __init__(self, nvml: NvmlApi, *, clock: Callable[[], float] = time.time) -> None:
        self._nvml = nvml
        self._clock = clock
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NoGpusError(f"NVML is unavailable ({exc}); {SIMULATE_HINT}") from exc
        try:
            count = nvml.nvmlDeviceGetCount()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._inventory = [self._describe(i, h) for i, h in enumerate(self._handles)]
        except nvml.NVMLError as exc:
            nvml.nvmlShutdown()
            raise NoGpusError(f"NVML could not list the GPUs ({exc}); {SIMULATE_HINT}") from exc
        if not self._inventory:
            nvml.nvmlShutdown()
            raise NoGpusError(f"NVML reports no GPUs on this machine; {SIMULATE_HINT}")
        self._index_by_uuid = {g.uuid: g.index for g in self._inventory}
        self._event_set: Any = None
        self.xid_supported: frozenset[int] = frozenset()
        self._register_xid_events()

    def inventory(self) -> Sequence[GpuDevice]:
        return list(self._inventory)

    def sample(self, busy: Set[int]) -> list[GpuReading]:
        del busy  # real devices report their own utilisation
        return [self._sample_one(info, self._handles[info.index]) for info in self._inventory]

    def poll_xid_errors(self) -> list[XidError]:
        if self._event_set is None:
            return []
        nvml = self._nvml
        errors: list[XidError] = []
        for _ in range(_MAX_EVENTS_PER_POLL):
            try:
                # A zero timeout makes the wait a non-blocking poll.
                data = nvml.nvmlEventSetWait(self._event_set, 0)
            except nvml.NVMLError:
                # NVMLError_Timeout is the normal "nothing pending"; any other error ends the
                # poll too, and the next one tries again.
                break
            if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
                continue
            uuid: str | None
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
            except nvml.NVMLError:
                uuid = None
            errors.append(
                XidError(
                    index=self._index_by_uuid.get(uuid) if uuid is not None else None,
                    uuid=uuid,
                    xid=int(data.eventData),
                    time=self._clock(),
                )
            )
        return errors

    def compute_processes(self, indices: Sequence[int]) -> int | None:
        nvml = self._nvml
        try:
            return sum(
                len(nvml.nvmlDeviceGetComputeRunningProcesses(self._handles[i])) for i in indices
            )
        except (nvml.NVMLError, IndexError):
            return None

    def close(self) -> None:
        nvml = self._nvml
        if self._event_set is not None:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()

    def _describe(self, index: int, handle: Any) -> GpuDevice:
        nvml = self._nvml
        name = _text(nvml.nvmlDeviceGetName(handle))
        return GpuDevice(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            name=name,
            generation=generation_of(name),
            memory_total_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
            simulated=False,
            device=_device_node(nvml, handle),
        )

    def _register_xid_events(self) -> None:
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError:
            return
        supported: set[int] = set()
        for info, handle in zip(self._inventory, self._handles, strict=True):
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
            except nvml.NVMLError:
                # NotSupported on some SKUs and in containers without the capability: the
                # device still runs jobs, we just cannot watch its XIDs.
                continue
            supported.add(info.index)
        if supported:
            self._event_set = event_set
            self.xid_supported = frozenset(supported)
        else:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(event_set)

    def _sample_one(self, info: GpuDevice, handle: Any) -> GpuReading:
        nvml = self._nvml
        now = self._clock()

        def read(getter: Callable[[], float | int]) -> float | None:
            try:
                return float(getter())
            except nvml.NVMLError_NotSupported:
                return None

        try:
            utilization = read(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            memory_used = read(lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used)
            temperature = read(
                lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            )
            power_mw = read(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        except nvml.NVMLError as exc:
            return GpuReading(info.index, info.uuid, now, None, None, None, None, error=str(exc))
        return GpuReading(
            index=info.index,
            uuid=info.uuid,
            time=now,
            utilization_pct=utilization,
            memory_used_bytes=int(memory_used) if memory_used is not None else None,
            temperature_c=temperature,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
        )


def _text(value: str | bytes) -> str:
    # Older pynvml releases return bytes for names and UUIDs.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _device_node(nvml: Any, handle: Any) -> Path | None:
    try:
        return Path(f"/dev/nvidia{int(nvml.nvmlDeviceGetMinorNumber(handle))}")
    except Exception:  # NVMLError (not supported: e.g. a MIG device), or no such call
        return None
