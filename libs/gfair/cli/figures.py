"""The figures of `gfair simulate --plot` and `gfair compare --plot`, drawn with matplotlib, an
optional dependency (``pip install 'gfair[plot]'``): loaded only when a figure is asked for,
and missing it is said before any replay runs."""

from __future__ import annotations

from types import ModuleType


def plotting() -> ModuleType:
    """`gfair.sim.plot`; `ValueError` naming the extra when matplotlib is not installed."""
    try:
        from gfair.sim import plot
    except ImportError as exc:
        raise ValueError(
            f"--plot needs matplotlib ({exc.name or exc}): pip install 'gfair[plot]'"
        ) from None
    return plot
