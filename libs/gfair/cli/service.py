"""`gfair service NAME [flags]`: run one of the services in the foreground.

    gfair service split-stride --quantum-s 3 --nats nats://127.0.0.1:4222
    gfair service node-executor --node-id v100-0 --simulate-gpus v100:4

The flags of each service come from its settings (`gfair service NAME --help` lists them); every
flag can also be given as a ``GFAIR_*`` environment variable. Without ``--nats`` or
``$GFAIR_NATS_URL`` the service joins the cluster of a running `gfair up`, if there is one
(``gfair service node-executor --simulate-gpus k80:4`` adds a server to it).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from gfair.cli.arguments import add_command
from gfair.client.cluster_context import CREDS_ENV, NATS_URL_ENV, running_context
from gfair_services import SERVICE_NAMES
from gfair_services.entrypoint import run_service


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    names = [name.replace("_", "-") for name in SERVICE_NAMES]
    parser = add_command(subparsers, "service", __doc__)
    parser.add_argument("name", metavar="NAME", help=f"one of: {', '.join(names)}")
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="the service's flags")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    flags = list(args.flags)
    if not os.environ.get(NATS_URL_ENV) and not _names_nats(flags):
        _join_running_cluster()
    return run_service(args.name, flags)


def _names_nats(flags: list[str]) -> bool:
    return any(flag == "--nats" or flag.startswith("--nats=") for flag in flags)


def _join_running_cluster() -> None:
    """Point the service at a running `gfair up`, as the tool commands are."""
    found = running_context()
    if found is None:
        return
    os.environ[NATS_URL_ENV] = found.nats_url
    if found.creds and not any(os.environ.get(f"GFAIR_NATS_{n}") for n in _LOGINS):
        os.environ[CREDS_ENV] = found.creds


# Ways a service may already be told how to log in (`gfair.bus.serve.BusSettings`).
_LOGINS = ("USER", "TOKEN", "CREDS", "NKEY_SEED")
