"""GPU generation names: the pool a GPU belongs to, from the marketing name NVML reports.

The scheduler pools GPUs by generation ("v100", "a100"), not by SKU: an SXM2 16 GB and a PCIe
32 GB V100 train at nearly the same speed, and the measured throughput table is keyed that way.
"""

from __future__ import annotations

import re

# Model tokens as they appear in NVML names, each its own generation.
KNOWN_GENERATIONS: frozenset[str] = frozenset(
    {
        "k40", "k80", "m40", "m60", "p4", "p40", "p100", "v100", "t4",
        "a10", "a30", "a40", "a100", "l4", "l40", "l40s", "h100", "h200", "gh200", "b100", "b200",
    }
)  # fmt: skip

# Generations are used as subject tokens and keys: keep them within [a-z0-9-]{1,64}.
_MAX_LEN = 64
_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def generation_of(name: str) -> str:
    """'Tesla V100-SXM2-16GB' -> 'v100'; an unknown name -> a slug of the whole name."""
    lowered = name.lower()
    for token in _NON_ALNUM.split(lowered):
        if token in KNOWN_GENERATIONS:
            return token
    slug = _NON_ALNUM.sub("-", lowered).strip("-")[:_MAX_LEN].strip("-")
    if not slug:
        raise ValueError(f"GPU name {name!r} has no letters or digits to name a generation by")
    return slug
