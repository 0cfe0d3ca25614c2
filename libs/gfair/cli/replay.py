"""`gfair replay JOURNAL`: feed a scheduler journal's inputs to a fresh machine (`gfair.journal`)
and check that every output matches what was recorded."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gfair.journal import JournalError, replay_file


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="replay a scheduler journal; exit 1 at the first output that differs",
        description=(
            "Feed the inputs of a journal (gfair simulate --journal, split-stride's "
            "GFAIR_JOURNAL) to a machine built from its header, and compare every output with "
            "the recorded one. Exit 0 when all match, 1 with the first difference, 2 when the "
            "journal cannot be read."
        ),
    )
    parser.add_argument("journal", type=Path, help="the journal (JSON Lines)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        replayed = replay_file(args.journal)
    except (JournalError, OSError, TypeError) as error:
        print(f"gfair replay: error: {args.journal}: {error}", file=sys.stderr)
        return 2
    if replayed.difference is not None:
        print(f"gfair replay: {args.journal}: {replayed.difference}", file=sys.stderr)
        return 1
    print(
        f"{args.journal}: {replayed.inputs} inputs in {replayed.runs} run(s), every output matched"
    )
    return 0
