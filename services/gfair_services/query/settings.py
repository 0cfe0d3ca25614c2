"""Settings of the query service (environment `GFAIR_*`, or flags of `gfair service query`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gfair_services.query.fair_queue import Limits


class QuerySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

    query_concurrency: int = Field(
        default=16, ge=1, description="Questions answered at once; more wait their turn"
    )
    query_tenant_concurrency: int = Field(
        default=4,
        ge=1,
        description="Questions of one tenant answered at once; tenants take turns for the rest",
    )
    query_tenant_rate: float = Field(
        default=20.0, gt=0, description="Questions a second one tenant is answered, on average"
    )
    query_tenant_burst: int = Field(
        default=40, ge=1, description="Questions one tenant may have answered at once after a pause"
    )
    query_tenant_queue: int = Field(
        default=64,
        ge=1,
        description="Questions of one tenant waiting; more are refused at once (retry later)",
    )

    def limits(self) -> Limits:
        return Limits(
            slots=self.query_concurrency,
            per_tenant=self.query_tenant_concurrency,
            rate=self.query_tenant_rate,
            burst=self.query_tenant_burst,
            queue=self.query_tenant_queue,
        )
