"""`gfair cancel JOB`: cancel a job (``USER/JOB``, or ``JOB`` with ``--user``), or a job array.

Waits until the job is cancelled (or ended otherwise) unless `--no-wait`. A job that already
ended is left alone. JOB may name a job array (`gfair submit --array`): every member that has
not ended is cancelled. `--json` prints ``{"user", "job_id", "state"}`` (a list for an array).
"""

from __future__ import annotations

import argparse
from typing import Any

from gfair.cli import output, session
from gfair.cli.arguments import add_command
from gfair.cli.wait import array_or_job
from gfair.client import GfairClient
from gfair.state.job_record import JobRecord


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "cancel", __doc__)
    session.add_job_argument(parser)
    parser.add_argument("--reason", help="why (kept with the job)")
    parser.add_argument("--no-wait", action="store_true", help="return once the request is sent")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS")
    session.add_connection_flags(parser)
    parser.set_defaults(func=lambda args: session.run(args, _cancel))


async def _cancel(client: GfairClient, args: argparse.Namespace) -> int:
    user, job_id = args.ref
    members = await array_or_job(client, user, job_id)
    if members:
        return await _cancel_array(client, args, user, members)
    state = await client.cancel(
        user, job_id, reason=args.reason, wait=not args.no_wait, timeout_s=args.timeout
    )
    if args.json:
        output.print_json({"user": user, "job_id": job_id, "state": str(state)})
    else:
        output.console().print(f"{user}/{job_id}: {output.styled_state(state)}")
    return session.EXIT_OK


async def _cancel_array(
    client: GfairClient, args: argparse.Namespace, user: str, members: list[JobRecord]
) -> int:
    # Every request is sent before any is awaited, so the whole array stops together.
    for record in members:
        if record.live:
            await client.cancel(user, record.job_id, reason=args.reason, wait=False)
    results = []
    for record in members:
        state = record.state
        if record.live and not args.no_wait:
            state = await client.wait(user, record.job_id, timeout_s=args.timeout)
        results.append((record.job_id, state))
    if args.json:
        output.print_json([{"user": user, "job_id": j, "state": str(s)} for j, s in results])
    else:
        for job_id, state in results:
            output.console().print(f"{user}/{job_id}: {output.styled_state(state)}")
    return session.EXIT_OK
