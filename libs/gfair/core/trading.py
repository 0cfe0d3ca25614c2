"""Second-price trading of GPU share between users across pool pairs (docs/design.md §2.5).

For a pair of pools (slow L, fast H) every user holding share in both bids its speedup
``speed[H] / speed[L]``. The exact rule implemented:

1. Bidders: users holding more than `min_quantity` GPUs of share in both L and H, with a defined
   bid (a user that cannot use L at all bids +inf; one that can use neither does not bid).
   Bids are ranked highest first; equal bids by user name.
2. Buyer = highest bid, seller = lowest bid.
3. Price p (L-GPUs paid per H-GPU) =
   ``max(second-highest bid, seller bid * (1 + min_seller_gain))``.
   The second-highest bid is the Vickrey price: a user cannot lower what it pays by misreporting.
   Bidders tied with the buyer are buyers too (they trade in turn, at the same price), so the
   second-highest bid is the highest one *below* the buyer's: on a large cluster many users run
   the same job type, and pricing a buyer at its own valuation would stop all trade.
   With exactly two bidders the second-highest bid *is* the seller's, which would leave the seller
   indifferent, so the price is raised to give it at least `min_seller_gain` (default 10%); the
   same floor applies with more bidders when the second bid is within that margin of the seller's.
4. A trade happens only if ``seller bid < p < buyer bid`` (both strictly gain; when every bidder
   bids the same there is no trade). If the highest/lowest pair cannot trade, no pair can (any
   other pair has a lower buyer bid and at least the same price).
5. Quantity q = min(seller's H share, buyer's L share / p): the buyer gets q of H, the seller
   gets p*q of L. One of them runs out, leaves the auction, and steps 1-5 repeat.
6. With `demands` given, share beyond what a user's jobs ask is worth nothing to it: its
   effective throughput is that of its best `demand` GPUs of share (fastest pools first). A
   trade that would leave a party worse off by that measure (e.g. a seller already holding all it
   can use, paid in more slow GPUs than it gives fast ones) is shrunk to the largest quantity
   that does not; a party that cannot gain at this price leaves this pair's auction.

Pairs are visited fastest H first, then slowest L first (by the order of `pools`, slowest to
fastest), and the sweep over all pairs repeats until a sweep makes no trade (at most
`max_sweeps`). Each trade is a strict improvement for both parties and changes nobody else, so
every user's effective throughput (`effective_throughput`) ends at least where it started.
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


def effective_throughput(
    holding: Mapping[str, float], speed: Mapping[str, float], demand: float | None = None
) -> float:
    """``sum(holding * speed)`` over the user's best `demand` GPUs of share (all without one)."""
    if demand is None:
        return sum(gpus * speed.get(pool, 0.0) for pool, gpus in holding.items())
    left, total = demand, 0.0
    for pool in sorted(holding, key=lambda p: -speed.get(p, 0.0)):
        take = min(holding[pool], left)
        total += take * speed.get(pool, 0.0)
        left -= take
        if left <= 0:
            break
    return total


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
    ranked = {pair: _rank(held, speeds, *pair) for pair in pairs}
    trades: list[Trade] = []
    refused: dict[str, dict[tuple[str, str], float]] = {}
    for _ in range(max_sweeps):
        before = len(trades)
        for slow, fast in pairs:
            _auction(
                held,
                ranked[slow, fast],
                speeds,
                demands,
                slow,
                fast,
                min_seller_gain,
                min_quantity,
                trades,
                refused,
            )
        if len(trades) == before:
            break
    return TradeResult(tuple(trades), held)


def _rank(
    held: Mapping[str, Mapping[str, float]], speeds: Speeds, slow: str, fast: str
) -> list[tuple[float, str]]:
    """Every user's bid for the pair, highest first (equal bids by user name)."""
    bids = []
    for user in sorted(held):
        value = bid(speeds.get(user, {}), slow, fast)
        if value is not None:
            bids.append((value, user))
    bids.sort(key=lambda b: -b[0])  # stable
    return bids


def _auction(
    held: dict[str, dict[str, float]],
    ranked: list[tuple[float, str]],
    speeds: Speeds,
    demands: Mapping[str, float] | None,
    slow: str,
    fast: str,
    min_seller_gain: float,
    min_quantity: float,
    trades: list[Trade],
    refused: dict[str, dict[tuple[str, str], float]],
) -> None:
    # `refused`: per user and pair, the highest price at which it could not gain as the seller;
    # until its holdings change it cannot gain at that price or below either (it gives the
    # same fast share for less slow share), so later sweeps skip the exact check.
    # Bids do not change while trading, only who holds share in both pools; and only the
    # buyer (the front) or the seller (the back) ever leaves, so two ends walk inwards.
    bids = [
        b for b in ranked if held[b[1]][slow] > min_quantity and held[b[1]][fast] > min_quantity
    ]
    lower = _next_lower(bids)
    head, tail = 0, len(bids) - 1
    while head < tail:
        buyer_bid, buyer = bids[head]
        seller_bid, seller = bids[tail]
        second = bids[lower[head]][0] if lower[head] < tail else seller_bid
        price = max(second, seller_bid * (1.0 + min_seller_gain))
        if not (seller_bid < price < buyer_bid and math.isfinite(price) and price > 0):
            return
        quantity = min(held[seller][fast], held[buyer][slow] / price)
        limited = None
        if demands is not None and not _within_demand(
            held, demands, buyer, seller, quantity, price
        ):
            if price <= refused.get(seller, {}).get((slow, fast), -math.inf):
                quantity, limited = 0.0, seller
            else:
                quantity, limited = _acceptable(
                    held, speeds, demands, buyer, seller, slow, fast, price, quantity
                )
            if quantity <= min_quantity:
                if limited == seller:
                    prices = refused.setdefault(seller, {})
                    prices[slow, fast] = max(price, prices.get((slow, fast), -math.inf))
                head, tail = (head + 1, tail) if limited == buyer else (head, tail - 1)
                continue
        # Whichever side runs out is set to exactly zero and leaves the auction.
        payment = quantity * price
        if quantity >= held[seller][fast]:
            quantity = held[seller][fast]
            held[seller][fast] = 0.0
        else:
            held[seller][fast] -= quantity
        if payment >= held[buyer][slow]:
            payment = held[buyer][slow]
            held[buyer][slow] = 0.0
        else:
            held[buyer][slow] -= payment
        held[seller][slow] += payment
        held[buyer][fast] += quantity
        trades.append(Trade(buyer, seller, fast, slow, quantity, price, buyer_bid, seller_bid))
        refused.pop(buyer, None)
        refused.pop(seller, None)
        if limited == buyer or min(held[buyer][slow], held[buyer][fast]) <= min_quantity:
            head += 1
        if limited == seller or min(held[seller][slow], held[seller][fast]) <= min_quantity:
            tail -= 1


def _next_lower(bids: Sequence[tuple[float, str]]) -> list[int]:
    """For each place in `bids` (highest first), the place of the first strictly lower bid
    (`len(bids)` when none): the second-highest bid of a buyer among tied bidders."""
    lower = [len(bids)] * len(bids)
    for at in range(len(bids) - 2, -1, -1):
        lower[at] = at + 1 if bids[at + 1][0] < bids[at][0] else lower[at + 1]
    return lower


def _within_demand(
    held: Mapping[str, Mapping[str, float]],
    demands: Mapping[str, float],
    buyer: str,
    seller: str,
    quantity: float,
    price: float,
) -> bool:
    """Whether both parties hold no more than their demand before and after the trade: then
    every GPU of share counts, both gain at any price between the bids, and the bisection of
    `_acceptable` is not needed (the common case with many small users)."""
    for user, change in (
        (buyer, quantity - quantity * price),
        (seller, quantity * price - quantity),
    ):
        total = sum(held[user].values())
        if max(total, total + change) > demands.get(user, 0.0):
            return False
    return True


def _acceptable(
    held: Mapping[str, Mapping[str, float]],
    speeds: Speeds,
    demands: Mapping[str, float],
    buyer: str,
    seller: str,
    slow: str,
    fast: str,
    price: float,
    quantity: float,
) -> tuple[float, str | None]:
    """The largest quantity up to `quantity` leaving neither party worse off under its demand
    cap, and the party that limited it (None when neither did).

    A party's gain is concave and piecewise linear in the quantity (its throughput is the
    speed-weighted share of its best `demand` GPUs), so the quantities it accepts form an
    interval from zero, and the interval's end lies on the linear piece where the gain turns:
    found exactly from the pieces' ends, where a prefix of its pools (fastest first) fills its
    demand.
    """
    limited = None
    for user in (seller, buyer):
        gain = _Gain(held[user], speeds.get(user, {}), demands.get(user, 0.0), user == buyer)
        end = gain.positive_until(slow, fast, price, quantity)
        if end is None:
            continue
        if end <= 0.0:  # loses from the first unit: out at this price
            return 0.0, user
        quantity, limited = end, user
    return quantity, limited


class _Gain:
    """One party's throughput change as a function of the quantity traded (`_acceptable`)."""

    __slots__ = ("demand", "holding", "order", "sign", "speed")

    def __init__(
        self, holding: Mapping[str, float], speed: Mapping[str, float], demand: float, buys: bool
    ) -> None:
        self.holding, self.speed, self.demand = holding, speed, demand
        self.order = sorted(holding, key=lambda p: -speed.get(p, 0.0))  # fastest first
        self.sign = 1.0 if buys else -1.0

    def positive_until(self, slow: str, fast: str, price: float, quantity: float) -> float | None:
        """None when the gain is positive up to `quantity`; else the end of the quantities
        with positive gain (0 when there are none)."""
        slope = {fast: self.sign, slow: -self.sign * price}
        # The pieces' ends: where the cumulative holding of a prefix of pools meets the demand.
        ends = {quantity}
        level, rate = 0.0, 0.0
        for pool in self.order:
            level += self.holding[pool]
            rate += slope.get(pool, 0.0)
            if rate != 0.0:
                at = (self.demand - level) / rate
                if 0.0 < at < quantity:
                    ends.add(at)
        base = self._throughput(0.0, slope)
        before, before_gain = 0.0, 0.0
        for end in sorted(ends):
            gain = self._throughput(end, slope) - base
            if gain <= 0.0:
                if before_gain <= 0.0:
                    return 0.0
                # Linear between the two ends: the root, just inside the positive side.
                fraction = before_gain / (before_gain - gain) * (1.0 - 1e-9)
                return before + (end - before) * fraction
            before, before_gain = end, gain
        return None

    def _throughput(self, quantity: float, slope: Mapping[str, float]) -> float:
        left, total = self.demand, 0.0
        for pool in self.order:
            take = min(self.holding[pool] + slope.get(pool, 0.0) * quantity, left)
            total += take * self.speed.get(pool, 0.0)
            left -= take
            if left <= 0:
                break
        return total
