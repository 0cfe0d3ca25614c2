"""`gfair why JOB`: why a job waits (or how it ended), from the services' own records.

`--json` prints ``{"user", "job_id", "state", "headline", "reasons": [{"kind", "text"}]}``.
"""

from __future__ import annotations

import argparse
from typing import Any

from gfair.cli import output, session
from gfair.client import GfairClient


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "why",
        help="explain why a job waits",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("job", metavar="JOB", help="USER/JOB, or JOB with --user")
    session.add_user_flag(parser)
    session.add_connection_flags(parser)
    parser.set_defaults(func=lambda args: session.run(args, _why))


async def _why(client: GfairClient, args: argparse.Namespace) -> int:
    user, job_id = args.ref
    explanation = await client.why(user, job_id)
    if args.json:
        output.print_json(
            {
                "user": explanation.user,
                "job_id": explanation.job_id,
                "state": str(explanation.state),
                "headline": explanation.headline,
                "reasons": [{"kind": r.kind, "text": r.text} for r in explanation.reasons],
            }
        )
        return session.EXIT_OK
    console = output.console()
    console.print(f"[bold]{explanation.headline}[/]")
    for reason in explanation.reasons:
        console.print(f"  [dim]{reason.kind:>8}[/]  {reason.text}", highlight=False)
    return session.EXIT_OK
