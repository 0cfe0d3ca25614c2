"""Split-stride's settings: the quantum, where checkpoints live, the throughput table, and its
safety timeouts."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from gfair_services.tenants import TenantSettings
from gfair_services.topology import TopologySettings


class Settings(TenantSettings, TopologySettings):
    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

    quantum_s: float = Field(default=60.0, gt=0, description="Length of a time-slice quantum")
    checkpoint_root: Path = Field(
        default=Path("/tmp/gfair/checkpoints"),
        description="Root shared by every node; a job checkpoints in <root>/<user>/<job_id>",
    )
    release_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="Forget a start or suspend no node confirmed within this long",
    )
    unconfirmed_release_s: float = Field(
        default=15.0,
        gt=0,
        description="Forget sooner the stop of a start its node never confirmed",
    )
    max_usage_gap_s: float | None = Field(
        default=None,
        gt=0,
        description="Longest gap between ticks counted as GPU use (default: 2 quanta)",
    )
    throughputs: Path | None = Field(
        default=None,
        description="Gavel throughput table (default: the measurements packaged with gfair)",
    )

    @field_validator("checkpoint_root")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # Node executors on other machines resolve it as given: a relative path means nothing.
        return value.expanduser().absolute()

    def checkpoint_dir(self, user: str, job_id: str) -> str:
        return str(self.checkpoint_root / user / job_id)

    @property
    def usage_gap_s(self) -> float:
        return self.max_usage_gap_s or 2 * self.quantum_s
