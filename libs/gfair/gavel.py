"""Reads the measured Gavel throughput table into the plain dicts the core takes.

Gavel's table (`data/gavel_throughputs.json` in the repository) maps ``generation -> "('<job
type>', <gpus>)" -> {"null": steps/s of the job alone, "<other job>": [rates when packed with
it]}``; ``*_unconsolidated`` generations hold gangs spread over servers. Only the "alone" rates
are read. A zero rate means the job does not fit on that generation, and is kept as 0.0 so the
core can say so.

The table read is the one the environment variable ``GFAIR_THROUGHPUTS`` names, else the copy of
the alone rates packaged with gfair (`gfair.data.GAVEL_ALONE`), which reads the same as the full
table: a checkout and an install see the same numbers.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

from gfair.data import GAVEL_ALONE

ENV_THROUGHPUTS = "GFAIR_THROUGHPUTS"
_UNCONSOLIDATED = "_unconsolidated"

PACKAGED_THROUGHPUTS = GAVEL_ALONE


def default_throughputs_path() -> Path:
    configured = os.environ.get(ENV_THROUGHPUTS)
    return Path(configured) if configured else PACKAGED_THROUGHPUTS


def load_scaled_throughputs(
    path: Path | str | None = None, *, consolidated: bool = True
) -> dict[tuple[str, int], dict[str, float]]:
    """``(job_type, gpus) -> generation -> steps/s`` for every scale factor in the file.

    With `consolidated` False the ``*_unconsolidated`` measurements (gang spread over servers)
    are read instead, under their plain generation names.
    """
    source = Path(path) if path is not None else default_throughputs_path()
    try:
        raw = json.loads(source.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"throughput table {source} not found (set {ENV_THROUGHPUTS} to its path)"
        ) from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{source}: not JSON ({error})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{source}: expected an object of generations")
    table: dict[tuple[str, int], dict[str, float]] = {}
    for section, entries in raw.items():
        if section.endswith(_UNCONSOLIDATED) == consolidated:
            continue
        generation = section.removesuffix(_UNCONSOLIDATED)
        if not isinstance(entries, dict):
            raise ValueError(f"{source}: {section}: expected an object of job types")
        for key, measurements in entries.items():
            job_type, gpus = _parse_key(source, section, key)
            alone = measurements.get("null") if isinstance(measurements, dict) else None
            if not isinstance(alone, int | float) or alone < 0:
                raise ValueError(f"{source}: {section}.{key}.null: expected a rate >= 0")
            table.setdefault((job_type, gpus), {})[generation] = float(alone)
    return table


def load_throughputs(path: Path | str | None = None) -> dict[str, dict[str, float]]:
    """``job_type -> generation -> steps/s`` of one GPU (the table the core is seeded with)."""
    return {
        job_type: rates
        for (job_type, gpus), rates in load_scaled_throughputs(path).items()
        if gpus == 1
    }


def _parse_key(source: Path, section: str, key: str) -> tuple[str, int]:
    try:
        job_type, gpus = ast.literal_eval(key)
    except (ValueError, SyntaxError, TypeError):
        raise ValueError(
            f"{source}: {section}: key {key!r} is not \"('<job type>', <gpus>)\""
        ) from None
    if not isinstance(job_type, str) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"{source}: {section}: key {key!r} is not \"('<job type>', <gpus>)\"")
    return job_type, gpus
