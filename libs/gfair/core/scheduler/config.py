"""What the operator sets for gandiva-fair's scheduling, one set of defaults for the state
machine, the simulator's `gandiva-fair` policy and the live trading auction
(`gfair_services.trading_auction.settings`): the quantum, the users' tickets and the accounts
above them (a shares file), whether users trade share between pools and the least gain a seller
accepts (docs/design.md §2.5), how fast the throughput estimator follows observations, a job's
switch costs until measured, and how long unconfirmed commands are waited for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gfair.core.kernel import DEFAULT_QUANTUM_S
from gfair.core.shares_tree import ShareTree
from gfair.core.switch_costs import DEFAULT_COSTS, SwitchCosts


def _one_ticket(user: str) -> float:
    return 1.0


@dataclass(frozen=True)
class SchedulerConfig:
    quantum_s: float = DEFAULT_QUANTUM_S  # also what the kernel weighs a move's cost against
    trading: bool = True
    min_seller_gain: float = 0.10
    throughput_alpha: float = 0.3
    # A job's costs until measured, and a move's floor once measured.
    operator_costs: SwitchCosts = DEFAULT_COSTS
    tickets_of: Callable[[str], float] = field(default=_one_ticket, compare=False)
    shares: ShareTree | None = None  # accounts above the users; None: flat tickets
    # Forget a start or suspend no node confirmed within this long; sooner the stop of a start
    # never confirmed (the node refused the start, and answers neither).
    release_timeout_s: float = 120.0
    unconfirmed_release_s: float = 15.0
    # How long a prepared start's job waits for its process to park before it is given GPUs
    # anyway (the node's prepare timeout is 120 s).
    prepared_wait_s: float = 120.0
    # The longest gap between ticks counted as GPU use (default: 2 quanta).
    max_usage_gap_s: float | None = None
    # The nodes let go at once: a driver that carries out a plan's stops before any of its
    # starts and reports them before anything else happens (the simulator). A job the quantum
    # moves then starts on its new servers in the quantum's own plan, after the stops, instead
    # of once every old node said it let go. Never for live nodes: their reports take time, and
    # a job must not run twice meanwhile.
    moves_at_once: bool = False

    def __post_init__(self) -> None:
        if self.min_seller_gain < 0:
            raise ValueError(f"min_seller_gain must be >= 0, got {self.min_seller_gain}")
        if not 0 < self.throughput_alpha <= 1:
            raise ValueError(f"throughput_alpha must be in (0, 1], got {self.throughput_alpha}")

    @property
    def usage_gap_s(self) -> float:
        return self.max_usage_gap_s or 2 * self.quantum_s
