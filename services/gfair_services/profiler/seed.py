"""The measured table throughput estimates start from (seed, then observe: docs/design.md §2.4)."""

from __future__ import annotations

from pathlib import Path

import structlog

from gfair.core.throughput import ThroughputTable
from gfair.gavel import default_throughputs_path, load_throughputs

_log = structlog.get_logger("gfair.services.seed")


def seed_table(path: Path | None) -> ThroughputTable:
    """The Gavel table; without it, estimates start from generic speeds and learn from progress.

    A missing file is survivable (the cluster still schedules, only less well at first), so it
    is a warning, not a failure; a malformed one is a configuration error and raises.
    """
    try:
        return load_throughputs(path)
    except FileNotFoundError:
        _log.warning(
            "throughput table not found; starting from generic generation speeds",
            path=str(path or default_throughputs_path()),
        )
        return {}
