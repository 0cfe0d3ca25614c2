"""Accounts in a tree: the hierarchical water-fill (docs/design.md §1.1, `shares_tree`)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfair.core.cluster import parse_cluster_spec
from gfair.core.pools import entitlements, shares
from gfair.core.scheduler import SchedulerConfig
from gfair.core.shares_file import parse_shares
from gfair.core.shares_tree import ShareTree
from gfair.core.tickets import water_fill
from shares_example import EVERYONE
from shares_example import THREE_LEVELS as THREE_LEVELS_FILE

from .machine_harness import JobSpec, MachineHarness

THREE_LEVELS = parse_shares(THREE_LEVELS_FILE)


def fill(demand: dict[str, float], capacity: float = 60.0) -> dict[str, float]:
    return THREE_LEVELS.water_fill(capacity, {"eve": 1.0}, demand)


def test_backlogged_users_divide_each_level_by_tickets() -> None:
    # Root: research 3, prod 1, eve 1 -> 36, 12, 12. research: vision 1, nlp 2 -> 12, 24.
    # vision: alice 1, dave 3 -> 3, 9.
    result = THREE_LEVELS.fill(60.0, {"eve": 1.0}, dict.fromkeys(EVERYONE, 100.0))
    assert result.users == pytest.approx(
        {"alice": 3.0, "dave": 9.0, "bob": 24.0, "carol": 12.0, "eve": 12.0}
    )
    assert result.accounts == pytest.approx(
        {"research": 36.0, "research/vision": 12.0, "research/nlp": 24.0, "prod": 12.0}
    )


def test_what_a_child_cannot_use_goes_to_its_siblings_first() -> None:
    # nlp (bob) asks 4 of its 24: vision takes the other 20 of research's 36; prod and eve,
    # outside research, keep their 12.
    demand = dict.fromkeys(EVERYONE, 100.0) | {"bob": 4.0}
    assert fill(demand) == pytest.approx(
        {"alice": 8.0, "dave": 24.0, "bob": 4.0, "carol": 12.0, "eve": 12.0}
    )


def test_what_a_whole_account_cannot_use_goes_up_the_tree() -> None:
    # research asks 9 of its 36: the 27 left go to prod and eve, 1:1.
    demand = {"alice": 2.0, "dave": 3.0, "bob": 4.0, "carol": 100.0, "eve": 100.0}
    assert fill(demand) == pytest.approx(
        {"alice": 2.0, "dave": 3.0, "bob": 4.0, "carol": 25.5, "eve": 25.5}
    )


def test_an_account_with_nobody_active_takes_no_share() -> None:
    # Only vision and prod are active: research's 3 tickets are vision's alone.
    demand = {"alice": 100.0, "carol": 100.0, "bob": 0.0}
    result = THREE_LEVELS.fill(40.0, {}, demand)
    assert result.users == pytest.approx({"alice": 30.0, "carol": 10.0, "bob": 0.0})
    assert "research/nlp" not in result.accounts


def test_a_user_and_an_account_may_share_a_name() -> None:
    tree = ShareTree({"prod": 1.0}, {"carol": "prod"}, {"carol": 1.0})
    assert tree.water_fill(10.0, {"prod": 1.0}, {"carol": 10.0, "prod": 10.0}) == {
        "carol": 5.0,
        "prod": 5.0,
    }


FLAT = parse_shares("[users.alice]\ntickets = 2\n[users.bob]\ntickets = 0.7\n")

users = st.dictionaries(
    st.sampled_from(["alice", "bob", "carol", "dan", "erin"]),
    st.floats(0, 50, allow_subnormal=False),
    min_size=1,
)


@settings(max_examples=200, deadline=None)
@given(demand=users, capacity=st.floats(0, 200, allow_subnormal=False))
def test_a_flat_file_gives_exactly_the_flat_water_fill(
    demand: dict[str, float], capacity: float
) -> None:
    tickets = {user: FLAT.tickets_of(user, 1.3) for user in demand}
    assert FLAT.water_fill(capacity, tickets, demand) == water_fill(capacity, tickets, demand)
    pools = {"k80": capacity / 3, "v100": capacity - capacity / 3}
    assert entitlements(pools, tickets, demand, FLAT) == entitlements(pools, tickets, demand)
    speeds = {user: {"k80": 1.0, "v100": 1.5 + len(user) / 3} for user in demand}
    with_tree = shares(pools, tickets, demand, speeds, tree=FLAT)
    assert with_tree == shares(pools, tickets, demand, speeds)


@settings(max_examples=200, deadline=None)
@given(demand=st.dictionaries(st.sampled_from(EVERYONE), st.floats(0, 50), min_size=1))
def test_the_tree_hands_out_what_is_asked_up_to_the_capacity(demand: dict[str, float]) -> None:
    result = THREE_LEVELS.fill(60.0, {"eve": 1.0}, demand)
    assert sum(result.users.values()) == pytest.approx(min(60.0, sum(demand.values())))
    for user, gpus in result.users.items():
        assert -1e-9 <= gpus <= demand[user] + 1e-9
    for account, gpus in result.accounts.items():
        below = [u for u in demand if account in THREE_LEVELS.ancestors(THREE_LEVELS.account_of(u))]
        assert gpus == pytest.approx(sum(result.users[u] for u in below))


def test_a_tree_refuses_what_a_file_could_not_say() -> None:
    with pytest.raises(ValueError, match="parent account a is not defined"):
        ShareTree({"a/b": 1.0})
    with pytest.raises(ValueError, match="account x is not defined"):
        ShareTree({}, {"u": "x"}, {"u": 1.0})
    with pytest.raises(ValueError, match="tickets must be a finite number"):
        ShareTree({"a": 0.0})
    with pytest.raises(ValueError, match="has a demand but no tickets"):
        ShareTree().water_fill(1.0, {}, {"stranger": 1.0})


def test_the_scheduler_entitles_users_down_the_tree() -> None:
    cluster = parse_cluster_spec("v100:2x8,k80:4x4")  # 16 + 16 GPUs
    config = SchedulerConfig(trading=False, shares=THREE_LEVELS)
    scheduler = MachineHarness(cluster, {"alice": 50.0, "eve": 2.0}, {}, config)
    for index, user in enumerate(EVERYONE * 8):
        assert scheduler.submit(JobSpec(f"j{index}", user, 4), 0.0).accepted
    scheduler.plan(0.0)
    # Root: research 3, prod 1, eve 2 (its flat tickets) of 32 -> 16, 16/3, 32/3; alice keeps
    # the file's 1 ticket, not the flat 50.
    expected = THREE_LEVELS.water_fill(32.0, {"eve": 2.0}, dict.fromkeys(EVERYONE, 32.0))
    assert expected["eve"] == pytest.approx(32 / 3)
    assert expected["alice"] == pytest.approx(16 / 3 / 4)
    assert scheduler.entitlements().keys() == set(EVERYONE)
    for user, pools in scheduler.entitlements().items():
        assert pools["v100"] == pytest.approx(expected[user] / 2), user
        assert pools["k80"] == pytest.approx(expected[user] / 2), user
