"""How long the records of ended jobs are kept: a service `Settings` mixin.

Placement keeps a record per job in `gfair_jobs`, the failure detector one in `gfair_failures`;
each purges the records of jobs that ended more than ``GFAIR_JOB_RETENTION_S`` ago, so neither
bucket grows with the cluster's age. The jobs' events stay in `GFAIR_JOBS` for its own age limit.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class RetentionSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

    job_retention_s: float = Field(
        default=30 * 24 * 3600.0,
        gt=0,
        description="How long the record of an ended job (completed, failed, cancelled or "
        "rejected) is kept; then it is purged",
    )
    retention_check_s: float = Field(
        default=3600.0, gt=0, description="How often records past their retention are purged"
    )
