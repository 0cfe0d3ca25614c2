"""`gfair submit`: submit a job for a user, and by default wait until it is admitted.

    gfair submit --user alice --gpus 2 --job-type 'ResNet-50 (batch size 32)' --wait -- \\
        python -m gfair.sdk.synthetic --iterations 500

Without `--wait` it returns once placement accepted (or rejected) the job; with `--wait` (or
`--wait=running`), once it runs; with `--wait=completed`, once it ends, exiting with its outcome
as `gfair wait` does (0 completed, 1 failed or rejected, 5 cancelled); with `--no-wait`, as soon
as the submission is stored. A rejection exits 1. When `--timeout` passes first it exits 4 and
still prints the job and its state so far. `-f job.yaml` reads the job from a file (YAML, JSON
or TOML; `schemas/job-spec.schema.json`); flags given as well override its fields. `--json` prints
``{"user", "job_id", "event_id", "state", "reason", "code", "servers", "timed_out"}``.

`--array 0-99%8` submits a job array: one job per index (``0-99``, ``1,3,5-7``, ``0-15:4``), with
ids ``<array id>-<index>``, at most N of them running at once with ``%N`` (the scheduler
enforces it), each seeing its index in ``$GFAIR_ARRAY_INDEX`` and the array id in
``$GFAIR_ARRAY_ID``. The array id (`--job-id`, else generated from `--name`) is printed once;
`gfair wait`, `gfair cancel` and `gfair jobs --array` take it for the whole array. `--wait` with
an array waits for every member's admission (default) or end (`--wait=completed`, exiting with
the worst outcome). `--after-ok JOB[,JOB...]` (repeatable) holds the job until those jobs of the
same user completed successfully, and cancels it if one fails or is cancelled. `--prepare` says
the job calls `Job.from_env()` before touching any GPU (docs/jobs.md): its process may start,
without GPUs, before its first slice, so that its imports are not paid for on GPUs.
`--time-limit 4h` (Slurm's `--time`; also 90m, 1h30m, D-HH:MM:SS, or seconds) stops the job once
it has run that long on GPUs (waiting and time-sliced out time do not count): it fails with
failure class `time_limit`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

from gfair.cli import output, session, submission
from gfair.cli.arguments import add_command
from gfair.cli.speeds import job_type_warning
from gfair.client import GfairClient, Submitted, UnknownJob, WaitFor, WaitTimeout
from gfair.events.job_array import (
    ArrayMembership,
    ArraySpec,
    member_job_id,
    parse_array_spec,
)
from gfair.events.job_spec import JobSpec, load_job_spec
from gfair.events.states import JobState
from gfair.events.submission import JobSubmitted, new_job_id

# `--wait=STATE`: what the client waits for.
WAITS: dict[str, WaitFor] = {"accepted": "accepted", "running": "running", "completed": "ended"}
DEFAULT_TIMEOUT_S = 60.0
# The flags that, given, set the job spec's field of the same name.
_FLAGS = (
    "gpus",
    "tickets",
    "job_type",
    "name",
    "job_id",
    "workdir",
    "image",
    "max_retries",
    "array",
    "time_limit",
)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "submit", __doc__)
    parser.add_argument(
        "-f",
        "--file",
        type=Path,
        metavar="SPEC",
        help="the job as a YAML, JSON or TOML file (schemas/job-spec.schema.json)",
    )
    session.add_user_flag(parser)
    parser.add_argument("--gpus", type=int, help="GPUs the job needs at once")
    parser.add_argument("--tickets", type=float, help="weight among the user's own jobs")
    parser.add_argument("--job-type", help="model family, e.g. 'ResNet-50 (batch size 32)'")
    parser.add_argument("--name", help="a label (also the stem of the generated job id)")
    parser.add_argument("--job-id", help="choose the job id (default: generated)")
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="repeatable"
    )
    parser.add_argument("--workdir", help="absolute working directory on the node")
    parser.add_argument(
        "--image", help="run in this container image (the node's Docker engine), not as a process"
    )
    parser.add_argument(
        "--mount",
        action="append",
        default=[],
        metavar="HOST:CONTAINER[:ro]",
        help="a host path into the job's container (where the operator allows it); repeatable",
    )
    parser.add_argument("--max-retries", type=int, help="cap on retries after failures")
    parser.add_argument(
        "--time-limit",
        "--time",
        metavar="DURATION",
        help="stop it (failed, time_limit) once it ran this long on GPUs: 4h, 90m, 1h30m, "
        "D-HH:MM:SS, or seconds",
    )
    parser.add_argument(
        "--array",
        metavar="SPEC",
        help="a job array, one job per index: 0-99, 1,3,5-7, 0-15:4; %%N: at most N running",
    )
    parser.add_argument(
        "--after-ok",
        action="append",
        default=[],
        metavar="JOB[,JOB...]",
        help="hold until these jobs (yours) completed successfully; repeatable",
    )
    parser.add_argument(
        "--prepare",
        action="store_true",
        default=None,
        help="the job calls Job.from_env() before touching any GPU: its process may start "
        "before it is given GPUs",
    )
    waiting = parser.add_mutually_exclusive_group()
    waiting.add_argument(
        "--wait",
        nargs="?",
        const="running",
        choices=WAITS,
        metavar="STATE",
        help="wait until the job runs (--wait, --wait=running) or ends (--wait=completed)",
    )
    waiting.add_argument("--no-wait", action="store_true", help="do not wait for admission")
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="of the wait (default 60; none with --wait=completed)",
    )
    session.add_connection_flags(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- PROGRAM [ARGS...]")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        spec = job_spec(args, load_job_spec(args.file) if args.file is not None else JobSpec())
    except ValueError as exc:  # the file's, or an --env or --after-ok of the command line
        return session.fail(str(exc), session.EXIT_USAGE)
    if not spec.command:
        return session.fail(
            "give the job's command after --, e.g. -- python train.py", session.EXIT_USAGE
        )
    if spec.user is None:
        return session.fail(
            f"give --user (or ${session.USER_ENV}), or user: in the spec", session.EXIT_USAGE
        )
    if spec.gpus is None:
        return session.fail("give --gpus, or gpus: in the spec", session.EXIT_USAGE)
    if spec.array is not None and args.wait == "running":
        return session.fail(
            "--array waits for admission (default) or --wait=completed, not for running", 2
        )
    try:
        array = parse_array_spec(spec.array) if spec.array is not None else None
        # The job id is chosen here, so that it is checked, and a wait that times out can say
        # which job it was.
        base = spec.job_id or (
            new_job_id(spec.name) if array is None else array_id(spec.name, array)
        )
        jobs = (
            [submission.job(spec, base)]
            if array is None
            else [
                submission.job(
                    spec,
                    member_job_id(base, i),
                    ArrayMembership(id=base, index=i, limit=array.limit),
                )
                for i in array.indices
            ]
        )
    except ValueError as exc:  # a flag no cluster would accept, or an --array spec
        return session.fail(str(exc), session.EXIT_USAGE)
    _warn_of_speeds(spec.job_type)
    if array is None:
        return session.run(args, partial(_submit, job=jobs[0]))
    return session.run(args, partial(_submit_array, jobs=jobs, base=base, limit=array.limit))


def job_spec(args: argparse.Namespace, spec: JobSpec) -> JobSpec:
    """The job the command line describes: the file's `spec`, each flag given over it
    (checked as a whole by `submission.job`)."""
    given = {
        name: getattr(args, name)
        for name in (*_FLAGS, "prepare")
        if getattr(args, name) is not None
    }
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if command:
        given["command"] = tuple(command)
    # $GFAIR_USER is a default, the file says whose job it is.
    if args.user is not None and not (args.user == os.environ.get(session.USER_ENV) and spec.user):
        given["user"] = args.user
    if args.mount:
        given["mounts"] = (*spec.mounts, *args.mount)
    if args.after_ok:
        given["after_ok"] = dependencies(args.after_ok)
    given["env"] = {**spec.env, **submission.environment(args.env)}
    return spec.model_copy(update=given)


def _warn_of_speeds(job_type: str | None) -> None:
    if (warning := job_type_warning(job_type)) is not None:
        print(f"gfair submit: warning: {warning}", file=sys.stderr)


def dependencies(items: list[str]) -> tuple[str, ...]:
    """The job ids of repeated, comma-separated `--after-ok`s, each once, in order."""
    found: dict[str, None] = {}
    for item in items:
        for part in item.split(","):
            job_id = part.strip()
            if not job_id:
                raise ValueError(f"--after-ok {item!r}: an empty job id")
            if "/" in job_id:
                raise ValueError(
                    f"--after-ok {job_id!r}: give a job id of the same user, without USER/"
                )
            found[job_id] = None
    return tuple(found)


def array_id(name: str | None, spec: ArraySpec) -> str:
    """A fresh array id with room for ``-<largest index>`` within a job id's 64 characters."""
    room = 64 - len(f"-{spec.indices[-1]}")
    base = new_job_id(name)
    if len(base) <= room:
        return base
    stem, _, suffix = base.rpartition("-")
    return f"{stem[: room - len(suffix) - 1]}-{suffix}"


async def _submit(client: GfairClient, args: argparse.Namespace, *, job: JobSubmitted) -> int:
    wait: WaitFor = WAITS[args.wait] if args.wait else "none" if args.no_wait else "accepted"
    timeout_s = args.timeout
    if timeout_s is None and wait != "ended":
        timeout_s = DEFAULT_TIMEOUT_S
    try:
        submitted = await client.submit_job(job, wait=wait, timeout_s=timeout_s)
    except WaitTimeout:
        try:
            state = (await client.job(job.user, job.job_id, with_events=False)).state
        except UnknownJob:  # stored, but placement has not taken it in
            state = JobState.SUBMITTED
        submitted = Submitted(job.user, job.job_id, "", state)
        if args.json:
            output.print_json({**output.submitted_json(submitted), "timed_out": True})
        else:
            output.console().print(
                f"{submitted.ref}: {output.styled_state(state)} "
                f"(still waiting when the timeout passed)"
            )
        return session.EXIT_TIMEOUT
    if args.json:
        output.print_json({**output.submitted_json(submitted), "timed_out": False})
    elif submitted.rejected:
        output.console().print(
            f"[red]rejected[/] {submitted.ref} ({submitted.code}): {submitted.reason}"
        )
    else:
        where = f" on {', '.join(submitted.servers)}" if submitted.servers else ""
        reason = f" ({submitted.reason})" if submitted.reason and wait == "ended" else ""
        output.console().print(
            f"{submitted.ref}: {output.styled_state(submitted.state)}{where}{reason}"
        )
    if wait == "ended" or submitted.state.terminal:
        return session.outcome_code(submitted.state)
    return session.EXIT_OK


async def _submit_array(
    client: GfairClient,
    args: argparse.Namespace,
    *,
    jobs: list[JobSubmitted],
    base: str,
    limit: int | None,
) -> int:
    user = jobs[0].user
    members = {job.job_id: job.array.index for job in jobs if job.array is not None}
    for job in jobs:
        await client.submit_job(job, wait="none", timeout_s=None)
    shown = f", at most {limit} running" if limit else ""
    if not args.json:
        output.console().print(f"{user}/{base}: array of {len(members)} job(s){shown}")
    states: dict[str, JobState] = dict.fromkeys(members, JobState.SUBMITTED)
    reasons: dict[str, str | None] = dict.fromkeys(members)
    timed_out = False
    if args.wait is not None or not args.no_wait:
        timeout_s = args.timeout if args.timeout is not None else DEFAULT_TIMEOUT_S
        try:
            records = await client.admitted(user, list(members), timeout_s=timeout_s)
            states.update({job_id: r.state for job_id, r in records.items()})
            reasons.update({job_id: r.reason for job_id, r in records.items()})
        except WaitTimeout:
            timed_out = True
    if args.wait == "completed" and not timed_out:
        for job_id in members:
            try:
                states[job_id] = await client.wait(user, job_id, timeout_s=args.timeout)
            except WaitTimeout:
                timed_out = True
                break
    if args.json:
        output.print_json(
            {
                "user": user,
                "array_id": base,
                "limit": limit,
                "jobs": [
                    {
                        "job_id": job_id,
                        "index": index,
                        "state": str(states[job_id]),
                        "reason": reasons[job_id],
                    }
                    for job_id, index in members.items()
                ],
                "timed_out": timed_out,
            }
        )
    else:
        counts: dict[JobState, int] = {}
        for state in states.values():
            counts[state] = counts.get(state, 0) + 1
        summary = ", ".join(f"{n} {output.styled_state(state)}" for state, n in counts.items())
        late = " (still waiting when the timeout passed)" if timed_out else ""
        output.console().print(f"{user}/{base}: {summary}{late}")
        for job_id, state in states.items():
            if state is JobState.REJECTED:
                output.console().print(f"[red]rejected[/] {user}/{job_id}: {reasons[job_id]}")
    if timed_out:
        return session.EXIT_TIMEOUT
    return worst_outcome(states.values(), ended=args.wait == "completed")


def worst_outcome(states: Iterable[JobState], *, ended: bool) -> int:
    """The exit code of many jobs: failed (or rejected) over cancelled over completed; states
    not ended count only when `ended` was awaited."""
    codes = [session.outcome_code(s) for s in states if ended or s.terminal]
    for code in (session.EXIT_FAILED, session.EXIT_CANCELLED):
        if code in codes:
            return code
    return session.EXIT_OK
