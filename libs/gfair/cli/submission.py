"""The submission a `gfair submit` command line describes, checked before anything is sent.

Every field goes through the same model the services validate (`JobSubmitted`), and the gang
size through placement's own limit, so a typo is a usage error (exit 2) naming its flag, not a
request that fails at the far end (exit 1) or a rejection after the job was stored.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from pydantic import ValidationError

from gfair.events.admission_limits import MAX_JOB_GPUS, MAX_JOB_GPUS_ENV, MAX_JOB_TICKETS
from gfair.events.errors import field_path
from gfair.events.job_array import ArrayMembership
from gfair.events.job_spec import JobSpec
from gfair.events.subjects import SubjectError, validate_token
from gfair.events.submission import JobSubmitted

ENV_NAME_RULE = "letters, digits and _, not starting with a digit"

# The flag that sets each field of `JobSubmitted`, for messages a user can act on: its name
# (`--max-retries` sets `max_retries`) but for these.
FLAGS: dict[str, str] = {"command": "the command", "working_dir": "--workdir", "mounts": "--mount"}
# The fields of a spec that are not a submission's field of the same name.
_NOT_SHARED = frozenset({"job_id", "workdir", "array", "prepare"})


class UsageError(ValueError):
    """A flag no cluster would accept; the message names the flag."""


def environment(items: Sequence[str]) -> dict[str, str]:
    """``NAME=VALUE`` items as a mapping; `UsageError` for one without a name or ``=``."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--env {item!r}: expected NAME=VALUE")
        env[name] = value
    return env


def max_job_gpus() -> int:
    """Placement's limit: its default, or the operator's ``$GFAIR_MAX_JOB_GPUS`` when set here
    too (a tool cannot read the service's settings, and must not refuse what it admits)."""
    configured = os.environ.get(MAX_JOB_GPUS_ENV, "")
    return int(configured) if configured.isdigit() and int(configured) > 0 else MAX_JOB_GPUS


def job(spec: JobSpec, job_id: str, array: ArrayMembership | None = None) -> JobSubmitted:
    """The submission `spec` describes (its user, GPUs and command given) for `job_id`;
    `UsageError` naming the first flag that a cluster would refuse, with its value."""
    if spec.user is None or spec.gpus is None or spec.command is None:
        raise UsageError("a job has a user, GPUs and a command")
    limit = max_job_gpus()
    if not 1 <= spec.gpus <= limit:
        raise UsageError(
            f"--gpus {spec.gpus}: a job asks for 1 to {limit} GPUs (placement's limit)"
        )
    if spec.tickets is not None and spec.tickets > MAX_JOB_TICKETS:
        raise UsageError(f"--tickets {spec.tickets:g}: at most {MAX_JOB_TICKETS:g}")
    try:
        validate_token(spec.user, what="--user")
        validate_token(job_id, what="--job-id")
    except SubjectError as exc:
        raise UsageError(str(exc)) from None
    # Each field given, by its name: a new one of both needs nothing here.
    given = {
        name: value
        for name in JobSpec.model_fields
        if name not in _NOT_SHARED and (value := getattr(spec, name)) is not None
    }
    try:
        return JobSubmitted(
            **given,
            job_id=job_id,
            working_dir=spec.workdir,
            array=array,
            prepare=bool(spec.prepare),
        )
    except ValidationError as exc:
        raise UsageError(describe(exc)) from None


def describe(error: ValidationError) -> str:
    """The first problem, as ``--flag: what is wrong`` (one line; the rest follow once fixed)."""
    detail = error.errors(include_url=False)[0]
    loc = detail["loc"]
    field = str(loc[0]) if loc else ""
    flag = FLAGS.get(field, f"--{field.replace('_', '-')}")
    message = str(detail["msg"]).removeprefix("Value error, ")
    if not loc:  # a rule over several fields: its message names them
        return message
    if field == "env" and len(loc) > 1:
        # pydantic's path ends in "[key]", and its message is the regex.
        return f"{flag} {loc[1]}=...: {loc[1]!r} is not a variable name ({ENV_NAME_RULE})"
    value = detail.get("input")
    if len(loc) > 1:
        where = f"{flag} {field_path(loc[1:], '')}"
    elif isinstance(value, str | int | float):
        where = f"{flag} {value!r}" if isinstance(value, str) else f"{flag} {value:g}"
    else:
        where = flag
    return f"{where}: {message}"
