"""`gfair why JOB`: why a job waits (or how it ended), from the services' own records.

JOB may name a job array (`gfair submit --array`), as for `gfair wait` and `gfair cancel`: each
member is explained. `--json` prints ``{"user", "job_id", "state", "headline", "reasons":
[{"kind", "text"}]}`` (a list of those for an array).
"""

from __future__ import annotations

import argparse
from typing import Any

from gfair.cli import output, session
from gfair.cli.arguments import add_command
from gfair.cli.wait import array_or_job
from gfair.client import Explanation, GfairClient


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "why", __doc__)
    session.add_job_argument(parser)
    session.add_connection_flags(parser)
    parser.set_defaults(func=lambda args: session.run(args, _why))


async def _why(client: GfairClient, args: argparse.Namespace) -> int:
    user, job_id = args.ref
    members = await array_or_job(client, user, job_id)
    ids = [r.job_id for r in members] if members else [job_id]
    explanations = [await client.why(user, member) for member in ids]
    if args.json:
        found = [_json(e) for e in explanations]
        output.print_json(found if members else found[0])
        return session.EXIT_OK
    console = output.console()
    if members:
        console.print(f"[bold]{user}/{job_id}[/]: array of {len(members)} job(s)")
    for explanation in explanations:
        console.print(f"[bold]{explanation.headline}[/]")
        for reason in explanation.reasons:
            console.print(f"  [dim]{reason.kind:>8}[/]  {reason.text}", highlight=False)
    return session.EXIT_OK


def _json(explanation: Explanation) -> dict[str, Any]:
    return {
        "user": explanation.user,
        "job_id": explanation.job_id,
        "state": str(explanation.state),
        "headline": explanation.headline,
        "reasons": [{"kind": r.kind, "text": r.text} for r in explanation.reasons],
    }
