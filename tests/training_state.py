"""Bitwise equality of training state (model and optimizer `state_dict`s): what the tests of
time-sliced, parked and moved training compare against an uninterrupted run."""

from __future__ import annotations

from typing import Any

# The thread count of the job and of its uninterrupted run. A node gives a job its share of
# its CPUs in threads (`gfair.node.job_threads`), which differs between servers of different
# sizes, and floating-point sums depend on how they are split among threads: a job that must
# be bitwise reproducible across moves pins its count, as these do.
PINNED_THREADS = {"OMP_NUM_THREADS": "1"}


def equal(a: Any, b: Any) -> bool:
    """Bitwise equality of nested state dicts (tensors by `torch.equal`)."""
    import torch  # only the tests that train import this module, after their importorskip

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
