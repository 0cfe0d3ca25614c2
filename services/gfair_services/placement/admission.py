"""Admission checks that need no cluster state: who may submit, and the size limits.

The event contract already bounds every field (a payload that breaks it never reaches a
handler: the runtime dead-letters it); these are the operator's tighter limits.
"""

from __future__ import annotations

from dataclasses import dataclass

from gfair.events.reasons import RejectionCode
from gfair.events.submission import JobSubmitted

from .settings import Settings


@dataclass(frozen=True, slots=True)
class Refusal:
    code: RejectionCode
    reason: str


def check_submission(data: JobSubmitted, subject_user: str, settings: Settings) -> Refusal | None:
    if data.user != subject_user:
        return Refusal(
            RejectionCode.USER_MISMATCH,
            f"the job is for user {data.user!r} but was submitted on {subject_user!r}'s subject",
        )
    if settings.allowed_users and data.user not in settings.allowed_users:
        return Refusal(RejectionCode.UNKNOWN_USER, f"user {data.user!r} may not submit jobs here")
    if data.gpus > settings.max_job_gpus:
        return Refusal(
            RejectionCode.INVALID,
            f"gpus: asks {data.gpus} GPUs; a job may ask at most {settings.max_job_gpus}",
        )
    command_chars = sum(len(arg) for arg in data.command)
    if command_chars > settings.max_command_chars:
        return Refusal(
            RejectionCode.INVALID,
            f"command: {command_chars} characters; at most {settings.max_command_chars}",
        )
    env_chars = sum(len(name) + len(value) for name, value in data.env.items())
    if env_chars > settings.max_env_chars:
        return Refusal(
            RejectionCode.INVALID,
            f"env: {env_chars} characters; at most {settings.max_env_chars}",
        )
    if data.tickets is not None and data.tickets > settings.max_job_tickets:
        return Refusal(
            RejectionCode.INVALID,
            f"tickets: {data.tickets:g}; a job may carry at most {settings.max_job_tickets:g}",
        )
    return None
