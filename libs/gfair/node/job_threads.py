"""How many threads a job's math libraries start: its share of the node's CPUs.

PyTorch (its OpenMP and MKL pools) and NumPy's BLAS start one thread per CPU of the machine
unless told otherwise. On a node those CPUs are shared: by the jobs on its other GPUs and by
gfair's own processes. A parallel region then waits for its slowest thread, and with as many
threads as the machine has CPUs one of them is often off its CPU: on two busy cores (2026-11-26)
4,000 mini-batches of ``examples/pytorch_train.py`` took 6-7 s with one thread and 29 s to
over 120 s with the default two. torchrun sets ``OMP_NUM_THREADS=1`` per process for the same
reason.

So a job starts with ``OMP_NUM_THREADS`` (which MKL and OpenBLAS follow too) set to its share:
the CPUs it may use (``GFAIR_JOB_CPUS_PER_GPU`` times its GPUs, where the operator set a CPU
limit), else the node's CPUs times its GPUs over the node's GPUs; rounded down, at least one. A
job that sets ``OMP_NUM_THREADS`` itself keeps its own value (`GFAIR_JOB_THREADS=off`: the
node sets nothing).
"""

from __future__ import annotations

import math
import os

THREADS_VARIABLE = "OMP_NUM_THREADS"


def node_cpus() -> int:
    """The CPUs this process may run on (its affinity, which a container's cpuset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_gpu(cpus_per_gpu: float | None, node_gpus: int, cpus: int | None = None) -> float:
    """One GPU's share of the node's CPUs, in threads (before rounding)."""
    if cpus_per_gpu is not None:
        return cpus_per_gpu
    return (node_cpus() if cpus is None else cpus) / max(node_gpus, 1)


def job_threads(per_gpu: float, gpus: int) -> int:
    """Threads for a job on `gpus` GPUs (at least one GPU's worth: a job on none runs code)."""
    return max(1, math.floor(per_gpu * max(gpus, 1) + 1e-9))
