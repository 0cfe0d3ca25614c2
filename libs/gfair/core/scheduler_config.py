"""What the operator sets for gandiva-fair's scheduling, one set of defaults for the simulator's
`gandiva-fair` policy and the live trading auction (`gfair_services.trading_auction.settings`):
whether users trade share between pools and the least gain a seller accepts (docs/design.md
§2.5), how fast the throughput estimator follows observations, the quantum a move's cost is
weighed against, and the accounts above the users (a shares file)."""

from __future__ import annotations

from dataclasses import dataclass

from gfair.core.shares_tree import ShareTree


@dataclass(frozen=True)
class SchedulerConfig:
    trading: bool = True
    min_seller_gain: float = 0.10
    throughput_alpha: float = 0.3
    quantum_s: float = 60.0  # what the kernel weighs a move's cost against
    shares: ShareTree | None = None  # accounts above the users; None: flat tickets

    def __post_init__(self) -> None:
        if self.min_seller_gain < 0:
            raise ValueError(f"min_seller_gain must be >= 0, got {self.min_seller_gain}")
        if not 0 < self.throughput_alpha <= 1:
            raise ValueError(f"throughput_alpha must be in (0, 1], got {self.throughput_alpha}")
