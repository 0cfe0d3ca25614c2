"""Usage that decays with a half-life (docs/design.md §1.1, `usage_decay`): the rule's worked
example in numbers, on a fluid model where each user receives exactly its entitlement."""

from __future__ import annotations

import itertools
import math

import pytest

from gfair.core.shares_file import parse_shares
from gfair.core.shares_tree import ShareTree
from gfair.core.usage_decay import DecayedUsage, fair_share_weights

HOUR = 3600.0
QUANTUM = 60.0
GPUS = 10.0
# 10 GPUs held for one half-life: each GPU-second weighed by its age.
ONE_HALF_LIFE_ALONE = GPUS * HOUR * 0.5 / math.log(2)


def test_a_child_on_its_share_weighs_half_its_tickets_and_an_idle_one_all() -> None:
    assert fair_share_weights({"a": 1.0, "b": 1.0}, {}) == {"a": 1.0, "b": 1.0}
    assert fair_share_weights({"a": 1.0, "b": 3.0}, {"a": 1.0, "b": 3.0}) == {"a": 0.5, "b": 1.5}
    assert fair_share_weights({"a": 1.0, "b": 1.0}, {"a": 5.0}) == {"a": 0.25, "b": 1.0}
    # No usage yet: exactly the instantaneous fill.
    tree = parse_shares("[accounts.lab]\n[users.a]\naccount = 'lab'\ntickets = 3")
    demand = {"a": 7.0, "b": 9.0, "c": 1.5}
    tickets = {"b": 0.3, "c": 2.0}
    assert tree.fill(10.0, tickets, demand, {}) == tree.fill(10.0, tickets, demand)


def test_usage_decays_by_half_every_half_life() -> None:
    usage = DecayedUsage(HOUR)
    for step in range(60):
        usage.advance((step + 1) * QUANTUM)
        usage.charge("a", GPUS, QUANTUM)
    assert usage.usage()["a"] == pytest.approx(ONE_HALF_LIFE_ALONE)
    assert round(ONE_HALF_LIFE_ALONE) == 25_969
    usage.advance(2 * HOUR)
    assert usage.usage()["a"] == pytest.approx(ONE_HALF_LIFE_ALONE / 2)
    with pytest.raises(ValueError, match="half_life_s"):
        DecayedUsage(0.0)


def run(
    tree: ShareTree, tickets: dict[str, float], late: str, hours: float
) -> tuple[list[dict[str, float]], DecayedUsage]:
    """Everyone but `late` backlogged from 0, `late` from one half-life on: the entitlement of
    every quantum after `late` arrives, and the usage at the end."""
    usage = DecayedUsage(HOUR)
    seen: list[dict[str, float]] = []
    for step in range(int(hours * HOUR / QUANTUM)):
        now = step * QUANTUM
        demand = {user: 100.0 for user in tickets if user != late or now >= HOUR}
        entitled = tree.fill(GPUS, tickets, demand, usage.usage()).users
        if late in demand:
            seen.append(entitled)
        usage.advance(now + QUANTUM)
        for user, gpus in entitled.items():
            usage.charge(user, gpus, QUANTUM)
    return seen, usage


def decayed_share(usage: DecayedUsage, user: str) -> float:
    used = usage.usage()
    return used[user] / sum(used.values())


def test_a_user_back_from_idling_gets_more_until_usage_evens_out() -> None:
    """The worked example: a and b, one ticket each, 10 GPUs, half-life 1 h; a alone for an
    hour (25,967 decayed GPU-seconds), then both backlogged."""
    seen, usage = run(ShareTree(), {"a": 1.0, "b": 1.0}, "b", 4.0)
    # u_a = 1, u_b = 0, s = 1/2: weights 1 * 2^-2 = 0.25 and 1 * 2^0 = 1, so 8 GPUs to b.
    assert seen[0] == pytest.approx({"a": 2.0, "b": 8.0})
    assert ShareTree().fill(GPUS, {"a": 1.0, "b": 1.0}, {"a": 100.0, "b": 100.0}).users == {
        "a": 5.0,
        "b": 5.0,
    }
    b = [entitled["b"] for entitled in seen]
    assert all(gpus > 5.0 for gpus in b)  # more than its instantaneous share throughout,
    assert all(x >= y for x, y in itertools.pairwise(b))  # less and less,
    assert b[59] == pytest.approx(5.56, abs=0.01)  # 5.6 GPUs an hour after its return
    assert b[-1] == pytest.approx(5.0, abs=0.05)  # and even three hours after.
    # Over the horizon (GPU-seconds weighed by age), what b received is within 2 points of its
    # tickets' proportion two half-lives after its return, where it was 0 then.
    _, at_two = run(ShareTree(), {"a": 1.0, "b": 1.0}, "b", 3.0)
    assert decayed_share(at_two, "b") == pytest.approx(0.5, abs=0.02)
    assert decayed_share(usage, "b") == pytest.approx(0.5, abs=0.01)


def test_unequal_tickets_are_tracked_too() -> None:
    seen, usage = run(ShareTree(), {"a": 1.0, "b": 3.0}, "b", 4.0)
    assert seen[0]["b"] > 0.75 * GPUS
    assert decayed_share(usage, "b") == pytest.approx(0.75, abs=0.02)


def test_an_accounts_usage_is_its_users_together() -> None:
    # lab (a1, a2) and b, one ticket each at the root; the lab has been busy, b comes back:
    # b gets 8 of 10, as a lone user would, and the lab's 2 are split 1:1 between its users.
    tree = parse_shares("[accounts.lab]\n[users.a1]\naccount = 'lab'\n[users.a2]\naccount = 'lab'")
    seen, usage = run(tree, {"a1": 1.0, "a2": 1.0, "b": 1.0}, "b", 4.0)
    assert seen[0] == pytest.approx({"a1": 1.0, "a2": 1.0, "b": 8.0})
    assert decayed_share(usage, "b") == pytest.approx(0.5, abs=0.01)
