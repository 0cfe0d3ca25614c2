"""Settings of the trading auction (environment `GFAIR_*`, or flags of `gfair service`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gfair.core.scheduler import SchedulerConfig
from gfair_services.tenants import TenantSettings
from gfair_services.topology import TopologySettings

# The simulator's defaults are the live cluster's (one `SchedulerConfig`).
_DEFAULTS = SchedulerConfig()


class TradingAuctionSettings(TenantSettings, TopologySettings):
    throughputs: Path | None = Field(
        default=None,
        description="Gavel throughput table for users nobody has profiled yet "
        "(default: the Gavel measurements packaged with gfair)",
    )
    trading: bool = Field(
        default=_DEFAULTS.trading, description="Trade share between pools; off: plain ticket shares"
    )
    min_seller_gain: float = Field(
        default=_DEFAULTS.min_seller_gain,
        ge=0,
        description="Least relative gain a seller must make on a trade (docs/design.md §2.5)",
    )
    quantum_s: float = Field(
        default=_DEFAULTS.quantum_s,
        gt=0,
        description="Split-stride's quantum (the same setting): in the shares file's decayed "
        "mode the auction reads split-stride's usage twice a quantum",
    )
    recompute_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="How often changed inputs are turned into a new allocation (debounce)",
    )
