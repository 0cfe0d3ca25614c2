"""`gfair schemas`: regenerate the JSON Schemas of the event contract, or check them (CI)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gfair.cli.arguments import add_command
from gfair.events import schema

# libs/gfair/cli/schemas.py -> the repository root, when running from a checkout.
_REPO_ROOT = Path(__file__).resolve().parents[3]


def default_directory() -> Path:
    if (_REPO_ROOT / "pyproject.toml").is_file():
        return _REPO_ROOT / "schemas"
    return Path.cwd() / "schemas"


# What `gfair schemas --help` says it does.
_DESCRIPTION = (
    "Write envelope.json, index.json and events/*.json under the schemas directory "
    "from the event models; other files there are left alone."
)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "schemas", _DESCRIPTION)
    parser.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 listing files that are missing, differ or are stale",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="schemas directory (default: schemas/ of the repository)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    directory: Path = args.dir if args.dir is not None else default_directory()
    if args.check:
        drifts = schema.check(directory)
        for drift in drifts:
            print(f"{directory / drift.path}: {drift.drift}", file=sys.stderr)
        if drifts:
            print(
                f"{len(drifts)} schema file(s) out of date with the event models; "
                "run `gfair schemas` and commit the result",
                file=sys.stderr,
            )
            return 1
        print(f"{directory}: schemas match the event models")
        return 0
    drifts = schema.write(directory)
    for drift in drifts:
        verb = "removed" if drift.drift is schema.Drift.STALE else "wrote"
        print(f"{verb} {directory / drift.path}")
    print(f"{directory}: {len(drifts)} file(s) changed")
    return 0
