"""The throughput estimator the scheduling services start from: the Gavel table packaged with
gfair (or the one a setting names), refined by the profiles the profiler publishes."""

from __future__ import annotations

from pathlib import Path

import structlog

from gfair.core.throughput import ThroughputEstimator
from gfair.gavel import load_throughputs

_log = structlog.get_logger("gfair.throughputs")


def load_estimator(path: Path | None) -> ThroughputEstimator:
    """An estimator seeded with the table at `path` (None: the packaged one). Profiles are
    already averaged by the profiler, so each replaces the previous one (alpha 1)."""
    try:
        table = load_throughputs(path)
    except FileNotFoundError as error:
        # Without measurements the services still work on the default speeds per generation.
        _log.warning("no throughput table; using default speeds", error=str(error))
        table = {}
    return ThroughputEstimator(table, alpha=1.0)
