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


# `gfair up --cluster local`: this machine's own GPUs, one server of them.
LOCAL_CLUSTER = "local"


def local_cluster_spec(nvml: NvmlApi | None = None) -> str:
    """This machine's GPUs, read through NVML, as a cluster spec of one server ('h200:1x1').

    Raises NoGpusError when NVML cannot be used or sees no GPU, and when the GPUs are of
    several generations: the scheduler pools GPUs by generation, and a server's GPUs are one
    pool's (a spec of simulated servers names such a machine's pools as separate servers).
    """
    gpus = open_gpus(nvml=nvml)
    try:
        generations = sorted({gpu.generation for gpu in gpus.inventory()})
        count = len(gpus.inventory())
    finally:
        gpus.close()
    if len(generations) != 1:
        raise NoGpusError(
            f"this machine's GPUs are of several generations ({', '.join(generations)}); "
            "a server's GPUs must be one generation's"
        )
    return f"{generations[0]}:1x{count}"
