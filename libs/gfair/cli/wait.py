"""`gfair wait JOB`: wait until a job (or every job of an array) ends; exit with its outcome.

    gfair wait alice/resnet-3f9c2a && echo trained

Exits 0 when the job completed, 1 when it failed or was rejected, 5 when it was cancelled, 4
when `--timeout` passed first (the job id and its state so far are printed all the same). JOB
may name a job array (`gfair submit --array`): it waits for every member and exits with the
worst outcome (failed over cancelled over completed).
`--json` prints ``{"user", "job_id", "state", "reason", "timed_out"}``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from gfair.cli import output, session
from gfair.cli.arguments import add_command
from gfair.client import GfairClient, UnknownJob, WaitTimeout
from gfair.events.states import JobState
from gfair.state.job_record import JobRecord


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "wait", __doc__)
    session.add_job_argument(parser)
    parser.add_argument(
        "--timeout", type=float, metavar="SECONDS", help="give up after this long (default: never)"
    )
    session.add_connection_flags(parser)
    parser.set_defaults(func=lambda args: session.run(args, _wait))


async def _wait(client: GfairClient, args: argparse.Namespace) -> int:
    user, job_id = args.ref
    members = await array_or_job(client, user, job_id)
    if members:
        return await _wait_array(client, args, user, [r.job_id for r in members])
    try:
        state = await client.wait(user, job_id, timeout_s=args.timeout)
    except WaitTimeout:
        details = await client.job(user, job_id, with_events=False)
        report(user, job_id, details.state, None, timed_out=True, as_json=args.json)
        return session.EXIT_TIMEOUT
    details = await client.job(user, job_id, with_events=False)
    reason = details.record.reason if details.record is not None else None
    report(user, job_id, state, reason, timed_out=False, as_json=args.json)
    return session.outcome_code(state)


async def array_or_job(client: GfairClient, user: str, job_id: str) -> list[JobRecord]:
    """The members of `user`'s array `job_id` when no job has that id; [] for a job.
    `UnknownJob` when it is neither."""
    try:
        await client.job(user, job_id, with_events=False)
        return []
    except UnknownJob:
        members = await client.array_members(user, job_id)
        if not members:
            raise
        return members


async def _wait_array(
    client: GfairClient, args: argparse.Namespace, user: str, job_ids: list[str]
) -> int:
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    states: dict[str, JobState] = {}
    for job_id in job_ids:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            states[job_id] = await client.wait(user, job_id, timeout_s=left)
        except WaitTimeout:
            break
    timed_out = len(states) < len(job_ids)
    for job_id in job_ids:
        details = await client.job(user, job_id, with_events=False)
        reason = details.record.reason if details.record is not None else None
        state = states.setdefault(job_id, details.state)
        report(user, job_id, state, reason, timed_out=timed_out, as_json=args.json)
    if timed_out:
        return session.EXIT_TIMEOUT
    codes = [session.outcome_code(s) for s in states.values()]
    for code in (session.EXIT_FAILED, session.EXIT_CANCELLED):
        if code in codes:
            return code
    return session.EXIT_OK


def report(
    user: str, job_id: str, state: JobState, reason: str | None, *, timed_out: bool, as_json: bool
) -> None:
    """The outcome (or, after a timeout, the state so far) on stdout, where scripts read it."""
    if as_json:
        output.print_json(
            {
                "user": user,
                "job_id": job_id,
                "state": str(state),
                "reason": reason,
                "timed_out": timed_out,
            }
        )
        return
    text = f"{user}/{job_id}: {output.styled_state(state)}"
    if timed_out:
        text += " (still waiting when the timeout passed)"
    elif reason:
        text += f" ({reason})"
    output.console().print(text)
