"""Second-price trading of GPU share between users across pool pairs (docs/design.md §2.5).

For a pair of pools (slow L, fast H) every user bids its speedup ``speed[H] / speed[L]`` (a user
that cannot use L at all bids +inf; one that can use neither does not bid). Bids are ranked
highest first, equal bids by user name. The exact rule implemented:

1. Sellers take turns, lowest speedup of the fastest pool over the slowest first (the reverse
   of that pair's ranking: on two pools the seller is the lowest bidder, as in the slides). On
   its turn a seller sells all it can in every pair it holds H share of (fastest H first, then
   slowest L first) before the next one's turn. So the highest- and lowest-speedup users trade
   with each other first (the slides' pair of the largest gain), and on three pools or more the
   top bidder does not spend all its slow share on the fastest pool, bought from every seller,
   before the lowest seller's share of a middle pool is even offered.
2. Buyer = the highest bidder holding L share (who can pay), above the seller.
3. Price p (L-GPUs paid per H-GPU) =
   ``max(second-highest bid, seller bid * (1 + min_seller_gain))``, the second-highest bid
   being the highest one *below* the buyer's among the users holding L share (each could buy
   too). It is the Vickrey price: a user cannot lower what it pays by misreporting. Bidders tied
   with the buyer are buyers too (they buy in turn, at the same price): on a large cluster many
   users run the same job type, and pricing a buyer at its own valuation would stop all trade.
   When the second-highest bid is the seller's own (two bidders), the seller would be left
   indifferent, so the price is raised to give it at least `min_seller_gain` (default 10%); the
   same floor applies whenever the second bid is within that margin of the seller's.
4. A trade happens only if ``seller bid < p < buyer bid`` (both strictly gain; when every bidder
   bids the same there is no trade). Prices only fall down the bids, so when the buyer's bid is
   not above the seller's floor no lower one is either, and the seller's turn in the pair ends.
5. Quantity q = min(seller's H share, buyer's L share / p): the buyer gets q of H, the seller
   gets p*q of L. A buyer that runs out of L share gives way to the next-highest bidder.
6. With `demands` given, share beyond what a user's jobs ask is worth nothing to it: its
   effective throughput is that of its best `demand` GPUs of share (fastest pools first). A
   trade that would leave a party worse off by that measure (e.g. a seller already holding all it
   can use, paid in more slow GPUs than it gives fast ones) is shrunk to the largest quantity
   that does not; a buyer that cannot gain at this price gives way to the next one until the
   next sweep, a seller that cannot ends its turn in the pair.

The sweep over all sellers repeats until a sweep makes no trade (at most `max_sweeps`). Each
trade is a strict improvement for both parties and changes nobody else, so every user's
effective throughput (`effective_throughput`) ends at least where it started.
"""

from __future__ import annotations

import bisect
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
    markets = [
        _Market(slow, fast, _rank(held, speeds, slow, fast), held, min_quantity)
        for slow, fast in pairs
    ]
    sellers = _sellers(held, speeds, pools)
    trades: list[Trade] = []
    refused: dict[str, dict[tuple[str, str], float]] = {}
    orders: dict[str, list[str]] = {}  # user -> its pools, fastest for it first (`_Gain`)
    for _ in range(max_sweeps):
        before = len(trades)
        for market in markets:
            market.full.clear()
        for seller in sellers:
            holding = held[seller]
            for market in markets:
                # Most sellers hold no share of most markets' fast pool: nothing to sell.
                if holding[market.fast] > market.least and seller in market.place:
                    _sell(
                        held,
                        markets,
                        market,
                        seller,
                        speeds,
                        demands,
                        min_seller_gain,
                        trades,
                        refused,
                        orders,
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


def _sellers(
    held: Mapping[str, Mapping[str, float]], speeds: Speeds, pools: Sequence[str]
) -> list[str]:
    """The order in which users sell: lowest speedup of the fastest pool over the slowest first,
    exactly the reverse of that pair's bids (so equal ones by name, last first); users that can
    use neither of those two pools after them, by name."""
    ranked = [user for _, user in reversed(_rank(held, speeds, pools[0], pools[-1]))]
    bidders = set(ranked)
    return ranked + [user for user in sorted(held) if user not in bidders]


class _Market:
    """One pool pair's bids, highest first, and the places among them of the users holding
    slow-pool share (who can pay), kept sorted as holdings change."""

    __slots__ = ("bids", "fast", "full", "least", "lower", "payers", "place", "slow")

    def __init__(
        self,
        slow: str,
        fast: str,
        bids: list[tuple[float, str]],
        held: Mapping[str, Mapping[str, float]],
        least: float,
    ) -> None:
        self.slow, self.fast, self.bids, self.least = slow, fast, bids, least
        self.place = {user: at for at, (_, user) in enumerate(bids)}
        self.lower = _next_lower(bids)
        self.payers = [at for at, (_, user) in enumerate(bids) if held[user][slow] > least]
        # Buyers whose demands let them gain nothing more at their price, until the next sweep.
        self.full: set[int] = set()

    def buyer(self) -> int | None:
        """The place of the highest bidder who can pay and is not `full`."""
        at = 0
        while at < len(self.payers) and self.payers[at] in self.full:
            at += 1
        return self.payers[at] if at < len(self.payers) else None

    def second(self, buyer: int) -> float:
        """The highest bid below the buyer's among the users who can pay; -inf when none."""
        at = bisect.bisect_left(self.payers, self.lower[buyer])
        return self.bids[self.payers[at]][0] if at < len(self.payers) else -math.inf

    def update(self, user: str, holding: Mapping[str, float]) -> None:
        """Whether `user` can pay, after its holding of the slow pool changed."""
        at = self.place.get(user)
        if at is None:
            return
        index = bisect.bisect_left(self.payers, at)
        listed = index < len(self.payers) and self.payers[index] == at
        if holding[self.slow] > self.least:
            if not listed:
                self.payers.insert(index, at)
        elif listed:
            del self.payers[index]


def _sell(
    held: dict[str, dict[str, float]],
    markets: Sequence[_Market],
    market: _Market,
    seller: str,
    speeds: Speeds,
    demands: Mapping[str, float] | None,
    min_seller_gain: float,
    trades: list[Trade],
    refused: dict[str, dict[tuple[str, str], float]],
    orders: dict[str, list[str]],
) -> None:
    """The seller sells its fast-pool share of the market to the highest bidders, each at its
    second price, until it has none left or no bidder pays it enough (module doc, steps 2-6)."""
    slow, fast, least = market.slow, market.fast, market.least
    at = market.place.get(seller)
    if at is None or held[seller][fast] <= least:
        return
    seller_bid = market.bids[at][0]
    floor = seller_bid * (1.0 + min_seller_gain)
    # `refused`: per user and pair, the highest price at which it could not gain as the seller;
    # until its holdings change it cannot gain at that price or below either (it gives the
    # same fast share for less slow share). Prices only fall down the bids, so its turn ends.
    while held[seller][fast] > least:
        head = market.buyer()
        if head is None or head >= at:
            return
        buyer_bid, buyer = market.bids[head]
        if not buyer_bid > floor:
            return  # nobody from here down pays more than the seller's floor
        price = max(market.second(head), floor)
        if not (seller_bid < price < buyer_bid and math.isfinite(price) and price > 0):
            return
        quantity = min(held[seller][fast], held[buyer][slow] / price)
        limited = None
        if demands is not None and not _within_demand(
            held, demands, buyer, seller, quantity, price
        ):
            if price <= refused.get(seller, {}).get((slow, fast), -math.inf):
                return
            quantity, limited = _acceptable(
                held, speeds, demands, buyer, seller, slow, fast, price, quantity, orders
            )
            if quantity <= least:
                if limited == seller:
                    prices = refused.setdefault(seller, {})
                    prices[slow, fast] = max(price, prices.get((slow, fast), -math.inf))
                    return
                market.full.add(head)  # it cannot gain at this price; the next buyer pays less
                continue
        # Whichever side runs out is set to exactly zero.
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
        for other in markets:
            if other.slow in (slow, fast):
                other.update(buyer, held[buyer])
                other.update(seller, held[seller])
        if limited == seller:
            return
        if limited == buyer:
            market.full.add(head)


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
    orders: dict[str, list[str]],
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
        holding, speed = held[user], speeds.get(user, {})
        order = orders.get(user)
        if order is None:  # its holding's pools never change, nor its speeds: sorted once
            order = orders[user] = sorted(holding, key=lambda p: -speed.get(p, 0.0))
        gain = _Gain(holding, speed, demands.get(user, 0.0), user == buyer, order)
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
        self,
        holding: Mapping[str, float],
        speed: Mapping[str, float],
        demand: float,
        buys: bool,
        order: list[str],
    ) -> None:
        self.holding, self.speed, self.demand = holding, speed, demand
        self.order = order  # the holding's pools, fastest first
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
