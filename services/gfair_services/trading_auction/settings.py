"""Settings of the trading auction (environment `GFAIR_*`, or flags of `gfair service`)."""

from __future__ import annotations

from pydantic import Field

from gfair.core.scheduler import SchedulerConfig
from gfair_services.skeleton import QuantumSettings, ThroughputsSettings
from gfair_services.tenants import TenantSettings
from gfair_services.topology import TopologySettings

# The simulator's defaults are the live cluster's (one `SchedulerConfig`).
_DEFAULTS = SchedulerConfig()


class TradingAuctionSettings(
    TenantSettings, TopologySettings, QuantumSettings, ThroughputsSettings
):
    trading: bool = Field(
        default=_DEFAULTS.trading, description="Trade share between pools; off: plain ticket shares"
    )
    min_seller_gain: float = Field(
        default=_DEFAULTS.min_seller_gain,
        ge=0,
        description="Least relative gain a seller must make on a trade (docs/design.md §2.5)",
    )
    recompute_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="How often changed inputs are turned into a new allocation (debounce)",
    )
