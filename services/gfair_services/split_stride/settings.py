"""Split-stride's settings: the quantum, where checkpoints live, the throughput table, and its
safety timeouts."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from gfair.core.scheduler import SchedulerConfig
from gfair.core.switch_costs import DEFAULT_COSTS, SwitchCosts
from gfair_services.skeleton import QuantumSettings, ThroughputsSettings
from gfair_services.tenants import TenantSettings
from gfair_services.topology import TopologySettings

# The default grace's floor: a real PyTorch job checkpoints and exits in about 0.75 s (1.2 s
# at worst measured), the synthetic job in 0.06 s; twice the worst keeps well-behaved jobs from
# being killed on a busy node while a job that ignores its yield holds an owed user's GPUs for
# under a quarter of the 3 s quanta `gfair up` runs (the longer grace of a long quantum leaves
# room for large checkpoints, and the overrun is charged to the job's user in any case).
MIN_YIELD_GRACE_S = 2.0


class SplitStrideSettings(TenantSettings, TopologySettings, QuantumSettings, ThroughputsSettings):
    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

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
    yield_grace_s: float | None = Field(
        default=None,
        gt=0,
        description="How long a job told to yield its GPUs (time slice, move) has to "
        "checkpoint and let go before its node kills it, losing what it did since its last "
        "checkpoint; sent with each suspend command (default: a quarter of the quantum, at "
        f"least {MIN_YIELD_GRACE_S:g}s)",
    )
    migration_cost_s: float = Field(
        default=DEFAULT_COSTS.migration_s,
        ge=0,
        description="Seconds of progress a job is taken to lose starting on other servers "
        "than it left (checkpoint written and read, a new process, CUDA initialised): the "
        "decision kernel moves a job only when the move gains more than this",
    )
    resume_cost_s: float = Field(
        default=DEFAULT_COSTS.resume_s,
        ge=0,
        description="Seconds of progress a job is taken to lose resuming on the servers it left",
    )

    journal: Path | None = Field(
        default=None,
        description="Append every input of the state machine and its outcome to this file "
        "(JSON Lines, one run per start; `gfair replay` checks it)",
    )

    @field_validator("checkpoint_root")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # Node executors on other machines resolve it as given: a relative path means nothing.
        return value.expanduser().absolute()

    def checkpoint_dir(self, user: str, job_id: str) -> str:
        return str(self.checkpoint_root / user / job_id)

    @property
    def yield_grace(self) -> float:
        """The grace every suspend this service sends carries (see `yield_grace_s`)."""
        if self.yield_grace_s is not None:
            return self.yield_grace_s
        return max(MIN_YIELD_GRACE_S, self.quantum_s / 4)

    def machine_config(self) -> SchedulerConfig:
        """What the state machine (`gfair.core.scheduler`) is configured with."""
        return SchedulerConfig(
            quantum_s=self.quantum_s,
            operator_costs=SwitchCosts(
                resume_s=self.resume_cost_s, migration_s=self.migration_cost_s
            ),
            tickets_of=self.tickets_of,
            shares=self.shares,
            release_timeout_s=self.release_timeout_s,
            unconfirmed_release_s=self.unconfirmed_release_s,
            max_usage_gap_s=self.max_usage_gap_s,
        )
