"""`gfair service NAME [flags]`: run one of the six services in the foreground.

    gfair service split-stride --quantum-s 3 --nats nats://127.0.0.1:4222
    gfair service node-executor --node-id v100-0 --simulate-gpus v100:4

The flags of each service come from its settings (`gfair service NAME --help` lists them); every
flag can also be given as a ``GFAIR_*`` environment variable.
"""

from __future__ import annotations

import argparse
from typing import Any

from gfair_services import SERVICE_NAMES
from gfair_services.entrypoint import run_service


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    names = [name.replace("_", "-") for name in SERVICE_NAMES]
    parser = subparsers.add_parser(
        "service",
        help="run one gfair service (placement, split-stride, node-executor, ...)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("name", metavar="NAME", help=f"one of: {', '.join(names)}")
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="the service's flags")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return run_service(args.name, list(args.flags))
