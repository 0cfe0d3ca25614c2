"""Second-price trading of GPU share between users across pool pairs (DESIGN 2.5).

For a pair of pools (slow L, fast H) every user holding share in both bids its speedup
``speed[H] / speed[L]``. The exact rule implemented:

1. Bidders: users holding more than `min_quantity` GPUs of share in both L and H, with a defined
   bid (a user that cannot use L at all bids +inf; one that can use neither does not bid).
   Bids are ranked highest first; equal bids by user name.
2. Buyer = highest bid, seller = lowest bid.
3. Price p (L-GPUs paid per H-GPU) =
   ``max(second-highest bid, seller bid * (1 + min_seller_gain))``.
   The second-highest bid is the Vickrey price: a user cannot lower what it pays by misreporting.
   With exactly two bidders the second-highest bid *is* the seller's, which would leave the seller
   indifferent, so the price is raised to give it at least `min_seller_gain` (default 10%); the
   same floor applies with more bidders when the second bid is within that margin of the seller's.
4. A trade happens only if ``seller bid < p < buyer bid`` (both strictly gain; ties at the top
   mean no trade, since the buyer would pay its own valuation). If the highest/lowest pair cannot
   trade, no pair can (any other pair has a lower buyer bid and at least the same price).
5. Quantity q = min(seller's H share, buyer's L share / p): the buyer gets q of H, the seller
   gets p*q of L. One of them runs out, leaves the auction, and steps 1-5 repeat.
6. With `demands` given, nobody is made to hold more GPUs than its jobs ask: when p > 1 the
   seller's total grows by q*(p - 1), when p < 1 the buyer's by q*(1 - p), and q is capped so
   that it stays within demand. A party left with no room leaves this pair's auction.

Pairs are visited fastest H first, then slowest L first (by the order of `pools`, slowest to
fastest), and the sweep over all pairs repeats until a sweep makes no trade (at most
`max_sweeps`). Each trade is a strict improvement for both parties and changes nobody else, so
every user's effective throughput ``sum(holding[p] * speed[p])`` ends at least where it started.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Holdings = Mapping[str, Mapping[str, float]]  # user -> pool -> GPUs of share
Speeds = Mapping[str, Mapping[str, float]]  # user -> pool -> relative speed


@dataclass(frozen=True)
class Trade:
    buyer: str
    seller: str
    fast_pool: str
    slow_pool: str
    quantity: float  # GPUs of fast-pool share moved from seller to buyer
    price: float  # slow-pool GPUs the buyer pays per fast-pool GPU
    buyer_bid: float
    seller_bid: float


@dataclass(frozen=True)
class TradeResult:
    trades: tuple[Trade, ...]
    holdings: dict[str, dict[str, float]]


def effective_throughput(holding: Mapping[str, float], speed: Mapping[str, float]) -> float:
    return sum(gpus * speed.get(pool, 0.0) for pool, gpus in holding.items())


def bid(speed: Mapping[str, float], slow: str, fast: str) -> float | None:
    """The user's speedup of `fast` over `slow`; None when it can use neither."""
    s_slow, s_fast = speed.get(slow, 0.0), speed.get(fast, 0.0)
    if s_slow <= 0:
        return math.inf if s_fast > 0 else None
    return s_fast / s_slow


def trade(
    holdings: Holdings,
    speeds: Speeds,
    pools: Sequence[str],
    *,
    min_seller_gain: float = 0.10,
    demands: Mapping[str, float] | None = None,
    min_quantity: float = 1e-9,
    max_sweeps: int = 32,
) -> TradeResult:
    """Run the auctions over every pool pair; `pools` lists the pools slowest to fastest."""
    if min_seller_gain < 0:
        raise ValueError(f"min_seller_gain must be >= 0, got {min_seller_gain}")
    held = {
        user: {p: float(holding.get(p, 0.0)) for p in pools} for user, holding in holdings.items()
    }
    for user, holding in held.items():
        for pool, gpus in holding.items():
            if gpus < 0:
                raise ValueError(f"user {user}: holding in {pool} is negative ({gpus})")
    pairs = [(pools[lo], pools[hi]) for hi in reversed(range(len(pools))) for lo in range(hi)]
    trades: list[Trade] = []
    for _ in range(max_sweeps):
        before = len(trades)
        for slow, fast in pairs:
            _auction(held, speeds, demands, slow, fast, min_seller_gain, min_quantity, trades)
        if len(trades) == before:
            break
    return TradeResult(tuple(trades), held)


def _auction(
    held: dict[str, dict[str, float]],
    speeds: Speeds,
    demands: Mapping[str, float] | None,
    slow: str,
    fast: str,
    min_seller_gain: float,
    min_quantity: float,
    trades: list[Trade],
) -> None:
    full: set[str] = set()  # users whose demand leaves no room to trade in this pair
    while True:
        bids: list[tuple[float, str]] = []
        for user in sorted(held):
            if held[user][slow] <= min_quantity or held[user][fast] <= min_quantity:
                continue
            if user in full:
                continue
            value = bid(speeds.get(user, {}), slow, fast)
            if value is not None:
                bids.append((value, user))
        if len(bids) < 2:
            return
        bids.sort(key=lambda b: -b[0])  # stable: equal bids stay in user-name order
        buyer_bid, buyer = bids[0]
        seller_bid, seller = bids[-1]
        price = max(bids[1][0], seller_bid * (1.0 + min_seller_gain))
        if not (seller_bid < price < buyer_bid and math.isfinite(price) and price > 0):
            return
        if demands is not None:
            grower = seller if price > 1 else buyer
            room = demands.get(grower, 0.0) - sum(held[grower].values())
            cap = room / abs(price - 1) if price != 1 else math.inf
            if cap <= min_quantity:
                full.add(grower)
                continue
        else:
            grower, cap = "", math.inf
        # Whichever side runs out is set to exactly zero, so it leaves the next round.
        affordable = held[buyer][slow] / price
        if cap < min(affordable, held[seller][fast]):
            quantity = cap
            payment = quantity * price
            held[seller][fast] -= quantity
            held[buyer][slow] -= payment
            full.add(grower)
        elif held[seller][fast] <= affordable:
            quantity = held[seller][fast]
            payment = min(quantity * price, held[buyer][slow])
            held[seller][fast] = 0.0
            held[buyer][slow] -= payment
        else:
            quantity = affordable
            payment = held[buyer][slow]
            held[seller][fast] -= quantity
            held[buyer][slow] = 0.0
        held[seller][slow] += payment
        held[buyer][fast] += quantity
        trades.append(Trade(buyer, seller, fast, slow, quantity, price, buyer_bid, seller_bid))
