"""What the trading auction keeps in `gfair_shares` (its only writer; docs/design.md §2.4, §2.5).

Keys:

- ``shares`` -> `SharesRecord`: the allocation in force: every active user's share of every pool
  before trading (its ticket share, water-filled by demand) and after, the trades that moved
  it, and the capacities it was computed for; with a shares file, its accounts (each one's
  tickets and the GPUs of its subtree's ticket share) and the account of each user it names.
  `gfair users` reads it; `revision` is the one of the `EntitlementsUpdated` event that
  announced it.
- ``job.*``, ``node.*``, ``profile.*``: the auction's inputs (active jobs, pool capacity, users'
  speed profiles), kept so that a restarted auction resumes exactly where it stopped. They are
  internal to the service and may change without notice; read the events instead.

Shares are in GPUs and may be fractional: 1.5 GPUs of a pool is 1.5 GPUs' worth of time.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from gfair.events.fields import Generation, UserName
from gfair.state.record import Record

SHARES_KEY = "shares"


class PoolShare(Record):
    fair: float = Field(ge=0, description="GPUs of share without trading (ticket share)")
    entitled: float = Field(ge=0, description="GPUs of share after trading")


class UserShare(Record):
    user: UserName
    tickets: float = Field(gt=0)
    jobs: int = Field(ge=0, description="Active (accepted, not finished) jobs")
    demand: int = Field(ge=0, description="GPUs its active jobs ask for together")
    pools: dict[Generation, PoolShare]
    # Relative speed per pool (its fastest = 1): what it bids with.
    speeds: dict[Generation, float] = Field(default_factory=dict)
    # Effective throughput: share times speed over its best `demand` GPUs of share (share
    # beyond what its jobs ask is worth nothing to it), in fastest-GPU equivalents.
    throughput_fair: float = Field(ge=0, description="Effective throughput without trading")
    throughput_entitled: float = Field(ge=0, description="Effective throughput after trading")

    def usable(self) -> dict[str, float]:
        """Entitlement per pool that its jobs can use: its best `demand` GPUs, fastest first.

        Trading may leave a seller holding more slow-pool share than its jobs ask (it was paid
        in it); only what its jobs can run on counts for it, as in the auction's own valuation.
        """
        left = float(self.demand)
        usable: dict[str, float] = {}
        for pool in sorted(self.pools, key=lambda p: -self.speeds.get(p, 0.0)):
            take = min(self.pools[pool].entitled, max(left, 0.0))
            usable[pool] = take
            left -= take
        return usable

    @property
    def gain(self) -> float:
        """Relative throughput gain from trading (0.3 = 30% faster); 0 without a baseline."""
        if self.throughput_fair <= 0:
            return 0.0
        return self.throughput_entitled / self.throughput_fair - 1.0


class AccountShare(Record):
    tickets: float = Field(gt=0)
    fair: float = Field(
        ge=0, description="GPUs of its subtree's ticket share (0 while nobody below is active)"
    )
    demand: float = Field(default=0.0, ge=0, description="GPUs its users' active jobs ask")


class TradeRecord(Record):
    buyer: UserName
    seller: UserName
    fast_pool: Generation
    slow_pool: Generation
    quantity: float = Field(gt=0, description="GPUs of fast-pool share the buyer got")
    price: float = Field(gt=0, description="Slow-pool GPUs paid per fast-pool GPU")
    buyer_bid: float
    seller_bid: float


class SharesRecord(Record):
    revision: int = Field(ge=0)
    computed_at: datetime
    trading: bool = True
    min_seller_gain: float = Field(ge=0)
    capacity: dict[Generation, int] = Field(
        default_factory=dict, description="GPUs per pool on nodes that take work"
    )
    users: dict[UserName, UserShare] = Field(default_factory=dict)
    trades: tuple[TradeRecord, ...] = ()
    # Indices into `trades` of the trades this revision cleared anew (announced by
    # `TradeCleared`); the others were in force already.
    cleared: tuple[int, ...] = ()
    # The shares file's tree (docs/design.md §1.1), empty without one: account path -> its
    # share, and user -> account path for the users the file names (the others: the root).
    accounts: dict[str, AccountShare] = Field(default_factory=dict)
    members: dict[UserName, str] = Field(default_factory=dict)
    # The shares file in force (as `render_shares` writes it; "" without one), and who put it
    # in force and when, if an operator did (`SharesChanged`; None: the service's own file).
    shares: str = ""
    shares_changed_by: str | None = None
    shares_changed_at: datetime | None = None
