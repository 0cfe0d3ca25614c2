"""Settings of the query service (environment `GFAIR_*`, or flags of `gfair service query`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class QuerySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

    query_concurrency: int = Field(
        default=16, ge=1, description="Questions answered at once; more wait their turn"
    )
