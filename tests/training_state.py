"""Bitwise equality of training state (model and optimizer `state_dict`s): what the tests of
time-sliced, parked and moved training compare against an uninterrupted run."""

from __future__ import annotations

from typing import Any


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
