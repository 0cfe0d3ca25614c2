"""Entry point of the `gfair` command: one argparse tree, one module per subcommand.

Each subcommand module exposes `register(subparsers)`, which adds its parser and sets
`func` (a callable taking the parsed namespace and returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules under gfair.cli that contribute subcommands, in help order.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "simulate",
    "compare",
    "schemas",
    "service",
    "up",
    "submit",
    "cancel",
    "jobs",
    "users",
    "nodes",
    "why",
    "trace",
    "demo",
    "tenants",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gfair",
        description="Fair-share scheduler for multi-tenant, heterogeneous GPU clusters.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in SUBCOMMAND_MODULES:
        module = importlib.import_module(f"gfair.cli.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
