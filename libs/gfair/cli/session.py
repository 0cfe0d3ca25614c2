"""What every tool subcommand shares: the NATS flag, the client, and errors as exit codes.

Exit codes of the tool commands (`submit`, `cancel`, `jobs`, `job`, `users`, `nodes`, `why`):

- 0: done;
- 1: the request failed (unknown job or node, a rejected submission, an invalid request);
- 2: bad command line: argparse's, and flags a cluster would refuse, checked before connecting
  (`--gpus 0`, `--env BADENV`, a malformed job reference);
- 3: no cluster: NATS unreachable, or no gfair cluster on it;
- 4: gave up waiting (`--wait`, `gfair wait`): the job may still get there;
- 5: the awaited job was cancelled (`gfair wait`, `submit --wait=completed`; a job that failed
  or was rejected exits 1, one that completed 0).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable

from gfair.client import (
    DEFAULT_NATS_URL,
    NATS_URL_ENV,
    ClientError,
    ConnectOptions,
    GfairClient,
    NoCluster,
    NotReachable,
    WaitTimeout,
)
from gfair.client.connection import tenant_login
from gfair.events.states import JobState
from gfair.events.subjects import SubjectError, validate_token

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_CLUSTER = 3
EXIT_TIMEOUT = 4
EXIT_CANCELLED = 5
USER_ENV = "GFAIR_USER"

Command = Callable[[GfairClient, argparse.Namespace], Awaitable[int]]


def add_connection_flags(parser: argparse.ArgumentParser, *, nested: bool = False) -> None:
    """`--nats`, `--creds` and `--json`.

    `nested` for a sub-subcommand: its defaults must not overwrite what was given before its
    name (``gfair nodes --nats URL uncordon X``).
    """
    default: object = argparse.SUPPRESS if nested else None
    parser.add_argument(
        "--nats",
        metavar="URL",
        default=default,
        help=f"NATS server URL(s), comma-separated (default: ${NATS_URL_ENV}, else the "
        f"cluster of a running `gfair up`, else {DEFAULT_NATS_URL})",
    )
    parser.add_argument(
        "--creds", metavar="FILE", default=default, help="NATS credentials file (JWT and NKey)"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if nested else False,
        help="print JSON instead of tables",
    )


def add_user_flag(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    # A tenant logged in as herself (GFAIR_NATS_USER) acts for herself: her login may
    # submit and read nothing else.
    login = os.environ.get("GFAIR_NATS_USER")
    default = os.environ.get(USER_ENV) or (tenant_login(login) if login else None)
    parser.add_argument(
        "--user",
        default=default,
        required=required and default is None,
        help=f"the job's user (default: ${USER_ENV}, else a tenant's own login)",
    )


def add_job_argument(parser: argparse.ArgumentParser) -> None:
    """The job a command acts on, and `--user` for a bare job id (`run` checks the pair)."""
    parser.add_argument("job", metavar="JOB", help="USER/JOB, or JOB with --user")
    add_user_flag(parser)


def job_reference(text: str, user: str | None) -> tuple[str, str]:
    """``USER/JOB``, or ``JOB`` with `user`; `ValueError` saying what is missing or wrong."""
    owner, slash, job_id = text.partition("/")
    if not slash:
        owner, job_id = user or "", text
        if not owner:
            raise ValueError(f"job {text!r}: give USER/JOB, or --user (or ${USER_ENV})")
    elif user is not None and user != owner:
        raise ValueError(f"job {text!r} belongs to {owner!r}, not --user {user!r}")
    try:
        validate_token(owner, what="user")
        validate_token(job_id, what="job id")
    except SubjectError as exc:
        raise ValueError(f"job {text!r}: {exc}") from None
    return owner, job_id


def run(
    args: argparse.Namespace,
    command: Command,
    check: Callable[[argparse.Namespace], None] | None = None,
) -> int:
    """Connect, run `command`, turn the client's errors into messages and exit codes.

    A command naming a job (`args.job`) finds it in `args.ref` as ``(user, job_id)``, checked
    before connecting: a malformed reference is a usage error, not a failed request. So is a
    `ValueError` of `check`, which reads the command's other flags into `args` first.
    """
    if isinstance(getattr(args, "job", None), str):
        try:
            args.ref = job_reference(args.job, getattr(args, "user", None))
        except ValueError as exc:
            return fail(str(exc), EXIT_USAGE)
    for flag in ("timeout", "interval"):
        value = getattr(args, flag, None)
        if isinstance(value, float | int) and value <= 0:
            return fail(f"--{flag} {value:g}: must be a positive number of seconds", EXIT_USAGE)
    if check is not None:
        try:
            check(args)
        except ValueError as exc:
            return fail(str(exc), EXIT_USAGE)
    try:
        return asyncio.run(_run(args, command))
    except NotReachable as exc:
        return fail(str(exc), EXIT_NO_CLUSTER)
    except NoCluster as exc:
        return fail(str(exc), EXIT_NO_CLUSTER)
    except WaitTimeout as exc:
        return fail(str(exc), EXIT_TIMEOUT)
    except (ClientError, ValueError) as exc:
        return fail(str(exc), EXIT_FAILED)


async def _run(args: argparse.Namespace, command: Command) -> int:
    options = ConnectOptions(user_credentials=getattr(args, "creds", None))
    client = await GfairClient.connect(getattr(args, "nats", None), options=options)
    async with client:
        return await command(client, args)


def outcome_code(state: JobState) -> int:
    """The exit code that says how an awaited job ended."""
    if state is JobState.COMPLETED:
        return EXIT_OK
    if state is JobState.CANCELLED:
        return EXIT_CANCELLED
    return EXIT_FAILED


def fail(message: str, code: int = EXIT_FAILED) -> int:
    print(f"gfair: {message}", file=sys.stderr)
    return code
