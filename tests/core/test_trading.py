"""Second-price trading (docs/design.md §2.5)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfair.core.trading import effective_throughput, trade

POOLS = ("k80", "v100")


def _speeds(speedup: float) -> dict[str, float]:
    return {"k80": 1.0, "v100": speedup}


def test_slides_three_bidders_pay_the_second_price() -> None:
    holdings = {u: {"k80": 10.0, "v100": 1.0} for u in ("U1", "U2", "U3")}
    speeds = {"U1": _speeds(6.0), "U2": _speeds(1.2), "U3": _speeds(2.0)}
    result = trade(holdings, speeds, POOLS)
    first = result.trades[0]
    assert (first.buyer, first.seller, first.price) == ("U1", "U2", 2.0)
    assert first.quantity == 1.0  # U2's whole V100 share; U1 could afford 10 / 2 = 5
    assert result.holdings["U2"] == {"k80": 12.0, "v100": 0.0}
    # U2 is out of V100; U1 and U3 are left, two bidders: U3's bid plus 10%.
    second = result.trades[1]
    assert (second.buyer, second.seller) == ("U1", "U3")
    assert second.price == pytest.approx(2.2)
    assert result.holdings["U1"] == pytest.approx({"k80": 10 - 2 - 2.2, "v100": 3.0})
    assert len(result.trades) == 2


def test_two_bidders_pay_the_seller_bid_plus_the_minimum_gain() -> None:
    holdings = {u: {"k80": 10.0, "v100": 1.0} for u in ("U1", "U2")}
    speeds = {"U1": _speeds(6.0), "U2": _speeds(1.2)}
    result = trade(holdings, speeds, POOLS, min_seller_gain=0.10)
    (only,) = result.trades
    assert only.price == pytest.approx(1.2 * 1.1)
    assert (only.buyer_bid, only.seller_bid) == (6.0, 1.2)


def test_two_close_bidders_do_not_trade() -> None:
    holdings = {u: {"k80": 10.0, "v100": 1.0} for u in ("U1", "U2")}
    speeds = {"U1": _speeds(1.3), "U2": _speeds(1.2)}  # 1.2 * 1.1 = 1.32 >= 1.3
    assert trade(holdings, speeds, POOLS).trades == ()
    assert trade(holdings, speeds, POOLS, min_seller_gain=0.05).trades != ()


def test_equal_top_bids_each_buy_at_the_next_lower_bid() -> None:
    # A's K80 share pays for half of C's V100 share; B, bidding the same, buys the rest.
    holdings = {u: {"k80": 0.55, "v100": 1.0} for u in ("A", "B")}
    holdings["C"] = {"k80": 10.0, "v100": 1.0}
    speeds = {"A": _speeds(5.0), "B": _speeds(5.0), "C": _speeds(1.0)}
    trades = trade(holdings, speeds, POOLS).trades
    assert {t.buyer for t in trades} == {"A", "B"} and {t.seller for t in trades} == {"C"}
    assert all(t.price == pytest.approx(1.1) for t in trades)  # C's bid with its 10% floor


def test_all_equal_bids_do_not_trade() -> None:
    holdings = {u: {"k80": 10.0, "v100": 1.0} for u in ("A", "B", "C")}
    assert trade(holdings, {u: _speeds(5.0) for u in holdings}, POOLS).trades == ()


def test_share_beyond_demand_is_worth_nothing_to_a_seller() -> None:
    holdings = {"U1": {"k80": 10.0, "v100": 1.0}, "U2": {"k80": 1.0, "v100": 1.0}}
    speeds = {"U1": _speeds(6.0), "U2": _speeds(1.2)}
    # Uncapped, U2 gains 0.32 K80 per V100 sold at 1.32...
    assert trade(holdings, speeds, POOLS).trades != ()
    # ...but its jobs ask 2 GPUs, all of which it already holds: K80 received in place of a V100
    # can only replace it, at a loss (1.0 < 1.2), so it does not sell.
    assert trade(holdings, speeds, POOLS, demands={"U1": 20.0, "U2": 2.0}).trades == ()


def test_a_buyer_over_its_demand_still_gains_from_fast_share() -> None:
    holdings = {"fast": {"k80": 10.0, "v100": 2.0}, "flat": {"k80": 10.0, "v100": 2.0}}
    speeds = {"fast": _speeds(8.0), "flat": _speeds(0.7)}
    result = trade(holdings, speeds, POOLS, demands={"fast": 12.0, "flat": 12.0})
    (only,) = result.trades
    assert only.price == pytest.approx(0.77) and only.quantity == pytest.approx(2.0)
    assert result.holdings["fast"]["v100"] == pytest.approx(4.0)


def test_the_lowest_speedup_user_sells_every_fast_pool_to_the_top_bidder_first() -> None:
    # Three pools. L gains least from a V100 (1x over a K80) and T most (10x); M is between.
    # L sells both its V100 and its P100 share to T, each at that pair's second bid (M's),
    # before T spends its K80 share on M's V100 share: L's P100 share does not go to M at the
    # 10% floor over L's own bid, as it did when the K80-V100 auction ran first for everyone.
    pools = ("k80", "p100", "v100")
    holdings = {u: {"k80": 40.0, "p100": 6.0, "v100": 3.0} for u in ("T", "M", "L")}
    speeds = {
        "T": {"k80": 1.0, "p100": 6.0, "v100": 10.0},
        "M": {"k80": 1.0, "p100": 3.0, "v100": 4.0},
        "L": {"k80": 1.0, "p100": 2.0, "v100": 1.0},
    }
    result = trade(holdings, speeds, pools)
    sold = [t for t in result.trades if t.seller == "L"]
    assert [(t.buyer, t.fast_pool, t.price, t.quantity) for t in sold] == [
        ("T", "v100", 4.0, 3.0),
        ("T", "p100", 3.0, 6.0),
    ]
    assert result.holdings["L"] == {"k80": 40.0 + 3 * 4.0 + 6 * 3.0, "p100": 0.0, "v100": 0.0}
    for user in holdings:
        before = effective_throughput(holdings[user], speeds[user])
        assert effective_throughput(result.holdings[user], speeds[user]) >= before


def test_a_user_without_fast_share_still_sets_the_price_it_would_pay() -> None:
    # B has sold all its V100 share already, but it holds K80 share and bids 4: A, the top
    # bidder, pays B's bid for C's V100, not C's bid plus 10%.
    holdings = {
        "A": {"k80": 10.0, "v100": 1.0},
        "B": {"k80": 10.0, "v100": 0.0},
        "C": {"k80": 10.0, "v100": 1.0},
    }
    speeds = {"A": _speeds(6.0), "B": _speeds(4.0), "C": _speeds(1.0)}
    (only,) = trade(holdings, speeds, POOLS).trades
    assert (only.buyer, only.seller, only.price) == ("A", "C", 4.0)


users = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d", "e", "f"]),
    st.tuples(
        st.lists(st.floats(0, 20), min_size=3, max_size=3),  # holdings k80, p100, v100
        st.lists(st.floats(0.05, 10), min_size=3, max_size=3),  # speeds
        st.floats(0, 30),  # extra demand above the holdings
    ),
    min_size=2,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(users=users, gain=st.floats(0, 0.5), capped=st.booleans())
def test_nobody_loses_prices_lie_between_bids_and_pools_are_conserved(
    users: dict[str, tuple[list[float], list[float], float]], gain: float, capped: bool
) -> None:
    pools = ("k80", "p100", "v100")
    holdings = {u: dict(zip(pools, h, strict=True)) for u, (h, _, _) in users.items()}
    speeds = {u: dict(zip(pools, s, strict=True)) for u, (_, s, _) in users.items()}
    demands = {u: sum(h) + extra for u, (h, _, extra) in users.items()} if capped else None
    result = trade(holdings, speeds, pools, min_seller_gain=gain, demands=demands)
    for user in users:
        demand = demands[user] if demands is not None else None
        before = effective_throughput(holdings[user], speeds[user], demand)
        after = effective_throughput(result.holdings[user], speeds[user], demand)
        assert after >= before - 1e-9 * max(1.0, before)
        assert all(v >= -1e-9 for v in result.holdings[user].values())
    for pool in pools:
        assert sum(h[pool] for h in result.holdings.values()) == pytest.approx(
            sum(h[pool] for h in holdings.values()), abs=1e-6
        )
    for t in result.trades:
        assert t.seller_bid < t.price < t.buyer_bid
        assert t.price >= t.seller_bid * (1 + gain) - 1e-12
        assert t.quantity > 0
