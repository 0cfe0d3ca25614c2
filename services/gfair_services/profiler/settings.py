"""Settings of the profiler (environment `GFAIR_*`, or flags of `gfair service profiler`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from gfair_services.skeleton import ThroughputsSettings
from gfair_services.topology import TopologySettings


class ProfilerSettings(TopologySettings, ThroughputsSettings):
    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

    profile_change: float = Field(
        default=0.05,
        gt=0,
        description="Publish a profile again once a speedup moved by more than this fraction "
        "(and a job's switch costs once an estimate did, by 0.1 s at least)",
    )
    throughput_alpha: float = Field(
        default=0.3, gt=0, le=1, description="Weight of a new measurement in the running mean"
    )
