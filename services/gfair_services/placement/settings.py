"""Placement's settings: admission limits and the throughput table."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field
from pydantic_settings import NoDecode, SettingsConfigDict

from gfair.events.admission_limits import MAX_JOB_GPUS, MAX_JOB_TICKETS
from gfair_services.containers import ContainerSettings
from gfair_services.retention import RetentionSettings
from gfair_services.skeleton import ThroughputsSettings
from gfair_services.tenants import TenantSettings
from gfair_services.topology import TopologySettings


def _names(value: object) -> object:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


class PlacementSettings(
    TenantSettings, TopologySettings, RetentionSettings, ContainerSettings, ThroughputsSettings
):
    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

    max_job_gpus: int = Field(
        default=MAX_JOB_GPUS, ge=1, description="Largest gang a user may ask for"
    )
    max_command_chars: int = Field(
        default=64 * 1024, ge=1, description="Longest command line (all arguments together)"
    )
    max_env_chars: int = Field(
        default=64 * 1024, ge=0, description="Most characters of extra environment per job"
    )
    max_job_tickets: float = Field(
        default=MAX_JOB_TICKETS,
        gt=0,
        description="Largest weight a job may carry among its user's jobs",
    )
    max_pending_jobs: int = Field(
        default=1000,
        ge=1,
        description="Most unfinished jobs (queued, running or suspended) one user may have; "
        "a submission beyond is rejected (too_many_pending)",
    )
    allowed_users: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_names)] = Field(
        default=(), description="Users allowed to submit (comma-separated); empty: anyone"
    )
