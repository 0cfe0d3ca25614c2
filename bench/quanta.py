"""The `--quanta` option of the live benchmarks that compare quantum lengths in one run."""

from __future__ import annotations

import argparse

DEFAULT_QUANTA = (3.0, 6.0)


def add_quanta_option(parser: argparse.ArgumentParser) -> None:
    """``--quanta 3,6``: the quantum lengths to run, in seconds, as a list of floats."""
    parser.add_argument(
        "--quanta",
        type=lambda text: [float(q) for q in text.split(",")],
        default=list(DEFAULT_QUANTA),
        help="quantum lengths, comma-separated (default 3,6)",
    )
