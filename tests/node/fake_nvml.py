"""A stand-in for the pynvml module: same names, same error classes, scripted devices.

It is handed to NvmlGpus as the module object; nothing global is patched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    def __init__(self, value: int, text: str) -> None:
        super().__init__(text)
        self.value = value


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(3, "Not Supported")


class NVMLError_Timeout(NVMLError):
    def __init__(self) -> None:
        super().__init__(10, "Timeout")


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(12, "NVML Shared Library Not Found")


class NVMLError_GpuIsLost(NVMLError):
    def __init__(self) -> None:
        super().__init__(15, "GPU is lost")


@dataclass
class FakeDevice:
    name: str | bytes
    uuid: str
    memory_total: int
    memory_used: int = 0
    utilization: int = 0
    temperature: int = 40
    power_mw: int | None = 50_000  # None: NotSupported
    lost: bool = False
    xid_supported: bool = True
    compute_pids: tuple[int, ...] = ()  # processes holding a context on it


@dataclass
class FakeNvml:
    devices: list[FakeDevice]
    init_error: NVMLError | None = None
    event_set_supported: bool = True
    pending_events: list[tuple[int, int, int]] = field(default_factory=list)  # device, type, xid
    calls: list[str] = field(default_factory=list)

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Timeout = NVMLError_Timeout
    NVML_TEMPERATURE_GPU = 0
    nvmlEventTypeXidCriticalError = 0x8
    nvmlEventTypeSingleBitEccError = 0x1

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        return self.devices[index]

    def _live(self, handle: FakeDevice) -> FakeDevice:
        if handle.lost:
            raise NVMLError_GpuIsLost()
        return handle

    def nvmlDeviceGetName(self, handle: FakeDevice) -> str | bytes:
        return self._live(handle).name

    def nvmlDeviceGetUUID(self, handle: FakeDevice) -> str:
        return self._live(handle).uuid

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice) -> Any:
        d = self._live(handle)
        return SimpleNamespace(total=d.memory_total, used=d.memory_used, free=0)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeDevice) -> Any:
        return SimpleNamespace(gpu=self._live(handle).utilization, memory=0)

    def nvmlDeviceGetTemperature(self, handle: FakeDevice, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._live(handle).temperature

    def nvmlDeviceGetPowerUsage(self, handle: FakeDevice) -> int:
        d = self._live(handle)
        if d.power_mw is None:
            raise NVMLError_NotSupported()
        return d.power_mw

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeDevice) -> list[Any]:
        return [SimpleNamespace(pid=pid) for pid in self._live(handle).compute_pids]

    def nvmlEventSetCreate(self) -> str:
        if not self.event_set_supported:
            raise NVMLError_NotSupported()
        self.calls.append("event_set_create")
        return "event-set"

    def nvmlDeviceRegisterEvents(
        self, handle: FakeDevice, event_types: int, event_set: Any
    ) -> None:
        assert event_set == "event-set"
        assert event_types == self.nvmlEventTypeXidCriticalError
        if not handle.xid_supported:
            raise NVMLError_NotSupported()

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        assert timeout_ms == 0, "polling must never block"
        if not self.pending_events:
            raise NVMLError_Timeout()
        index, event_type, xid = self.pending_events.pop(0)
        return SimpleNamespace(device=self.devices[index], eventType=event_type, eventData=xid)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.calls.append("event_set_free")
