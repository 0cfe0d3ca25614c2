"""Placement's settings: admission limits and the load balancer's brakes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, Field
from pydantic_settings import NoDecode, SettingsConfigDict

from gfair_services.shares import DEFAULT_SURPLUS_WEIGHT
from gfair_services.tenants import TenantSettings
from gfair_services.topology import TopologySettings


def _names(value: object) -> object:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


class Settings(TenantSettings, TopologySettings):
    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

    max_job_gpus: int = Field(default=256, ge=1, description="Largest gang a user may ask for")
    max_command_chars: int = Field(
        default=64 * 1024, ge=1, description="Longest command line (all arguments together)"
    )
    max_env_chars: int = Field(
        default=64 * 1024, ge=0, description="Most characters of extra environment per job"
    )
    max_job_tickets: float = Field(
        default=1000.0, gt=0, description="Largest weight a job may carry among its user's jobs"
    )
    allowed_users: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_names)] = Field(
        default=(), description="Users allowed to submit (comma-separated); empty: anyone"
    )
    balance_every_quanta: int = Field(
        default=5, ge=1, description="Run the load balancer on every N-th quantum tick"
    )
    balance_threshold: float = Field(
        default=0.25,
        ge=0,
        description="Ticket-load spread (max-min)/mean among a pool's servers tolerated",
    )
    migration_budget: int = Field(default=4, ge=0, description="Most migrations per balancing")
    surplus_weight: float = Field(default=DEFAULT_SURPLUS_WEIGHT, gt=0, lt=1)
    stale_tick_s: float = Field(
        default=30.0,
        gt=0,
        description="Ticks older than this (a backlog after downtime) skip balancing",
    )
    throughputs: Path | None = Field(
        default=None,
        description="Gavel throughput table (default: the measurements packaged with gfair)",
    )
