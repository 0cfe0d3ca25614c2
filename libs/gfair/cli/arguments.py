"""What every subcommand's parser shares: its entry in the tree and the checked argument types.

A subcommand's help line is the one `main.COMMANDS` lists (``gfair --help`` shows that table
without importing the command), so it is written once; its description is the first paragraph
of its module's docstring unless it says more.
"""

from __future__ import annotations

import argparse
from typing import Any

from gfair.cli.main import COMMANDS


def add_command(
    subparsers: argparse._SubParsersAction[Any],
    name: str,
    doc: str | None,
    *,
    description: str | None = None,
) -> argparse.ArgumentParser:
    """The parser of subcommand `name`, its help from `COMMANDS`, its description `doc`'s lead."""
    lead = doc.split("\n\n")[0] if doc else None
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=COMMANDS[name][1], description=description or lead
    )
    return parser


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def positive(text: str) -> float:
    """An argument type: a number > 0."""
    value = number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative(text: str) -> float:
    value = number(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def count(text: str) -> int:
    """An argument type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value
