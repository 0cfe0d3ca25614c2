"""Admission checks that need no cluster state: who may submit, the size limits, and the answer
to a submission the event contract refuses.

The event contract bounds every field; a payload that breaks it never reaches a handler (the
runtime refuses it, calls `answer_invalid_submission`, then dead-letters it). The limits here
are the operator's tighter ones (`PlacementSettings.max_job_gpus` and friends), refused with
`limit_exceeded`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gfair.bus.service import Emit, InvalidInput
from gfair.events.fields import MAX_REASON_CHARS
from gfair.events.jobs import JobRejected
from gfair.events.reasons import RejectionCode
from gfair.events.subjects import SubjectError, parse_submit_subject, validate_token
from gfair.events.submission import JobSubmitted

from .settings import PlacementSettings


@dataclass(frozen=True, slots=True)
class Refusal:
    code: RejectionCode
    reason: str


def check_submission(
    data: JobSubmitted, subject_user: str, settings: PlacementSettings
) -> Refusal | None:
    if data.user != subject_user:
        return Refusal(
            RejectionCode.USER_MISMATCH,
            f"the job is for user {data.user!r} but was submitted on {subject_user!r}'s subject",
        )
    if settings.allowed_users and data.user not in settings.allowed_users:
        return Refusal(RejectionCode.UNKNOWN_USER, f"user {data.user!r} may not submit jobs here")
    if data.gpus > settings.max_job_gpus:
        return Refusal(
            RejectionCode.LIMIT_EXCEEDED,
            f"gpus: asks {data.gpus} GPUs; a job may ask at most {settings.max_job_gpus}",
        )
    command_chars = sum(len(arg) for arg in data.command)
    if command_chars > settings.max_command_chars:
        return Refusal(
            RejectionCode.LIMIT_EXCEEDED,
            f"command: {command_chars} characters; at most {settings.max_command_chars}",
        )
    env_chars = sum(len(name) + len(value) for name, value in data.env.items())
    if env_chars > settings.max_env_chars:
        return Refusal(
            RejectionCode.LIMIT_EXCEEDED,
            f"env: {env_chars} characters; at most {settings.max_env_chars}",
        )
    if data.tickets is not None and data.tickets > settings.max_job_tickets:
        return Refusal(
            RejectionCode.LIMIT_EXCEEDED,
            f"tickets: {data.tickets:g}; a job may carry at most {settings.max_job_tickets:g}",
        )
    refused = settings.container_policy.refusal(data.image, data.mounts)
    if refused is not None:
        return Refusal(RejectionCode.NOT_ALLOWED, refused)
    return None


def check_pending(user: str, unfinished: int, settings: PlacementSettings) -> Refusal | None:
    """Refuse a new job of `user` when it already has `settings.max_pending_jobs` unfinished.

    Untrusted tenants could otherwise queue without bound: every queued job costs the
    scheduler memory and work each quantum, and its record space in `gfair_jobs`.
    """
    if unfinished < settings.max_pending_jobs:
        return None
    return Refusal(
        RejectionCode.TOO_MANY_PENDING,
        f"user {user!r} has {unfinished} unfinished jobs, the most allowed "
        f"(max_pending_jobs {settings.max_pending_jobs}); submit again when some have ended",
    )


def answer_invalid_submission(invalid: InvalidInput) -> list[Emit]:
    """`JobRejected` for a refused submission whose user and job id can be told, else nothing.

    The user is the one of the subject (whose credentials published it), never the payload's,
    so a forged payload cannot make an answer appear in another user's namespace. Without a
    job id that is a valid token there is nowhere to answer: the dead letter, with its reason,
    is the answer. Other refused inputs on the placement consumer (cancel requests, the
    services' own job reports) are answered by the dead letter alone: a `rejected` event on a
    cancel's job would announce the end of a job that may well be running.
    """
    try:
        user = parse_submit_subject(invalid.subject)
    except SubjectError:
        return []
    data = _payload_of(invalid)
    job_id = data.get("job_id")
    if not isinstance(job_id, str):
        return []
    try:
        validate_token(job_id, what="job id")
    except SubjectError:
        return []
    forged = isinstance(data.get("user"), str) and data["user"] != user
    code = RejectionCode.USER_MISMATCH if forged else RejectionCode.INVALID
    reason = f"invalid submission: {invalid.reason}"
    if len(reason) > MAX_REASON_CHARS:
        reason = reason[: MAX_REASON_CHARS - 3] + "..."
    return [Emit(JobRejected(user=user, job_id=job_id, code=code, reason=reason))]


def _payload_of(invalid: InvalidInput) -> dict[str, Any]:
    """The envelope's `data` object, from the parsed envelope or, failing that, the raw JSON."""
    if invalid.envelope is not None:
        return invalid.envelope.data
    try:
        body = json.loads(invalid.payload)
    except (ValueError, RecursionError):  # not JSON (or not UTF-8): nothing to recover
        return {}
    data = body.get("data") if isinstance(body, dict) else None
    return data if isinstance(data, dict) else {}
