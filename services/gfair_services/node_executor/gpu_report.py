"""The node's GPUs as events: inventory for registration, samples for telemetry, XID errors.

XID errors are polled from the GPU backend by whoever needs them first (the telemetry timer,
or the executor when a job exits, so that the XID that killed a job travels with its exit);
`XidLog` keeps them so both see every one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence

import structlog

from gfair.events import nodes as events
from gfair.node.gpu import GpuDevice, GpuReading, XidError

_log = structlog.get_logger("gfair.services.node_executor")
# Hours of XIDs even on a sick node; older ones cannot be tied to a running job anyway.
_XIDS_KEPT = 4096
# XIDs are timestamped when polled, up to one telemetry interval late: a little slack either way.
_XID_SLACK_S = 1.0


def inventory_event(gpus: Sequence[GpuDevice]) -> tuple[events.GpuInfo, ...]:
    return tuple(
        events.GpuInfo(
            index=gpu.index,
            uuid=gpu.uuid,
            name=gpu.name,
            generation=gpu.generation,
            memory_bytes=gpu.memory_total_bytes,
        )
        for gpu in gpus
    )


def telemetry_samples(
    samples: Iterable[GpuReading], xids: Mapping[int, Sequence[int]]
) -> tuple[events.GpuSample, ...]:
    """Samples of the GPUs that could be read; a reading the device does not support is 0."""
    out = []
    for sample in samples:
        if sample.error is not None:
            # An unreadable GPU is a health signal, reported through the log and its XIDs.
            _log.warning("GPU unreadable", gpu=sample.index, uuid=sample.uuid, error=sample.error)
            continue
        out.append(
            events.GpuSample(
                index=sample.index,
                utilization_pct=min(max(sample.utilization_pct or 0.0, 0.0), 100.0),
                memory_used_bytes=max(sample.memory_used_bytes or 0, 0),
                temperature_c=sample.temperature_c if sample.temperature_c is not None else 0.0,
                power_w=sample.power_w,
                xid_events=tuple(xids.get(sample.index, ())),
            )
        )
    return tuple(out)


class XidLog:
    def __init__(self, inventory: Sequence[GpuDevice]) -> None:
        self._index_of = {gpu.uuid: gpu.index for gpu in inventory}
        self._seen: deque[tuple[int | None, int, float]] = deque(maxlen=_XIDS_KEPT)
        self._unreported: list[tuple[int | None, int]] = []

    def add(self, errors: Iterable[XidError]) -> None:
        for error in errors:
            index = error.index
            if index is None and error.uuid is not None:
                index = self._index_of.get(error.uuid)
            _log.warning("XID error", gpu=index, xid=error.xid)
            self._seen.append((index, error.xid, error.time))
            self._unreported.append((index, error.xid))

    def during(self, indices: Iterable[int], start: float, end: float) -> tuple[int, ...]:
        """XIDs on these GPUs (or on no GPU in particular) between `start` and `end`."""
        wanted = set(indices)
        return tuple(
            xid
            for index, xid, when in self._seen
            if (index is None or index in wanted)
            and start - _XID_SLACK_S <= when <= end + _XID_SLACK_S
        )

    def take_unreported(self, indices: Iterable[int]) -> dict[int, list[int]]:
        """XIDs not yet in a telemetry sample, by GPU (one not tied to a GPU goes to all)."""
        by_gpu: dict[int, list[int]] = {}
        for index, xid in self._unreported:
            for target in indices if index is None else (index,):
                by_gpu.setdefault(target, []).append(xid)
        self._unreported = []
        return by_gpu
