"""`gfair submit`: submit a job for a user, and by default wait until it is admitted.

    gfair submit --user alice --gpus 2 --job-type 'ResNet-50 (batch size 32)' --wait -- \\
        python -m gfair.sdk.synthetic --iterations 500

Without `--wait` it returns once placement accepted (or rejected) the job; with `--wait`, once
it runs; with `--no-wait`, as soon as the submission is stored. A rejection exits 1.
`--json` prints ``{"user", "job_id", "event_id", "state", "reason", "code", "servers"}``.
"""

from __future__ import annotations

import argparse
from typing import Any

from gfair.cli import output, session
from gfair.client import GfairClient, WaitFor


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "submit",
        help="submit a job",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    session.add_user_flag(parser, required=True)
    parser.add_argument("--gpus", type=int, required=True, help="GPUs the job needs at once")
    parser.add_argument("--tickets", type=float, help="weight among the user's own jobs")
    parser.add_argument("--job-type", help="model family, e.g. 'ResNet-50 (batch size 32)'")
    parser.add_argument("--name", help="a label (also the stem of the generated job id)")
    parser.add_argument("--job-id", help="choose the job id (default: generated)")
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="repeatable"
    )
    parser.add_argument("--workdir", help="absolute working directory on the node")
    parser.add_argument("--max-retries", type=int, help="cap on retries after failures")
    waiting = parser.add_mutually_exclusive_group()
    waiting.add_argument("--wait", action="store_true", help="wait until the job runs")
    waiting.add_argument("--no-wait", action="store_true", help="do not wait for admission")
    parser.add_argument(
        "--timeout", type=float, default=60.0, metavar="SECONDS", help="of the wait (default 60)"
    )
    session.add_connection_flags(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- PROGRAM [ARGS...]")
    parser.set_defaults(func=main)


def environment(items: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--env {item!r}: expected NAME=VALUE")
        env[name] = value
    return env


def main(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        return session.fail("give the job's command after --, e.g. -- python train.py", 2)
    args.command = command
    return session.run(args, _submit)


async def _submit(client: GfairClient, args: argparse.Namespace) -> int:
    wait: WaitFor = "running" if args.wait else "none" if args.no_wait else "accepted"
    submitted = await client.submit(
        args.user,
        args.gpus,
        args.command,
        tickets=args.tickets,
        job_type=args.job_type,
        name=args.name,
        env=environment(args.env),
        working_dir=args.workdir,
        job_id=args.job_id,
        max_retries=args.max_retries,
        wait=wait,
        timeout_s=args.timeout,
    )
    if args.json:
        output.print_json(output.submitted_json(submitted))
    elif submitted.rejected:
        output.console().print(
            f"[red]rejected[/] {submitted.ref} ({submitted.code}): {submitted.reason}"
        )
    else:
        where = f" on {', '.join(submitted.servers)}" if submitted.servers else ""
        output.console().print(f"{submitted.ref}: {output.styled_state(submitted.state)}{where}")
    return session.EXIT_FAILED if submitted.rejected else session.EXIT_OK
