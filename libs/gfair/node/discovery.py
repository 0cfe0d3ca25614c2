"""Open the node's GPUs: NVML when there are real ones, simulated ones when asked for."""

from __future__ import annotations

from gfair.node.gpu import GpuBackend, NoGpusError
from gfair.node.nvml import SIMULATE_HINT, NvmlApi, NvmlGpus
from gfair.node.simulated import SimulatedGpus


def open_gpus(
    simulate: str | None = None, *, node_id: str = "local", nvml: NvmlApi | None = None
) -> GpuBackend:
    """Simulated GPUs for a spec like `v100:4,k80:2`; otherwise NVML (pynvml unless injected).

    Raises NoGpusError, telling the operator about `--simulate-gpus`, when NVML cannot be used.
    There is deliberately no silent fallback to simulation: a GPU server that lost its driver
    must not pretend to run jobs.
    """
    if simulate:
        return SimulatedGpus(simulate, node_id=node_id)
    if nvml is None:
        try:
            # Imported here: a simulated node never needs it.
            import pynvml
        except ImportError as exc:
            raise NoGpusError(f"pynvml (nvidia-ml-py) is not installed; {SIMULATE_HINT}") from exc
        nvml = pynvml
    return NvmlGpus(nvml)
