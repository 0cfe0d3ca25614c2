"""Tickets split among jobs, and water-filling (docs/design.md §1.1)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gfair.core.cluster import parse_cluster_spec
from gfair.core.pools import entitlements
from gfair.core.tickets import check_tickets, split_user_tickets, water_fill
from gfair.events.submission import JobSubmitted

from .machine_harness import JobSpec, MachineHarness


def test_user_tickets_are_split_equally_among_its_jobs() -> None:
    split = split_user_tickets({"u": 3.0, "v": 1.0}, {"u": ["a", "b", "c"], "v": ["d"]})
    assert split == {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}


def test_a_capped_user_leaves_its_surplus_to_the_others_by_tickets() -> None:
    share = water_fill(12, {"small": 1, "a": 1, "b": 2}, {"small": 1, "a": 100, "b": 100})
    assert share == pytest.approx({"small": 1, "a": 11 / 3, "b": 22 / 3})


def test_water_fill_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="x: has a demand but no weight"):
        water_fill(1, {}, {"x": 1})
    with pytest.raises(ValueError, match="demand must be >= 0"):
        water_fill(1, {"x": 1}, {"x": -1})


claims = st.dictionaries(
    st.text("abcdefgh", min_size=1, max_size=3),
    st.tuples(st.floats(0.1, 10), st.floats(0, 50)),
    min_size=1,
    max_size=10,
)


@settings(max_examples=200, deadline=None)
@given(capacity=st.floats(0, 200), claims=claims)
def test_water_fill_conserves_capacity_and_respects_demand(
    capacity: float, claims: dict[str, tuple[float, float]]
) -> None:
    weights = {k: w for k, (w, _) in claims.items()}
    demands = {k: d for k, (_, d) in claims.items()}
    share = water_fill(capacity, weights, demands)
    assert sum(share.values()) == pytest.approx(min(capacity, sum(demands.values())), abs=1e-6)
    for key, got in share.items():
        assert -1e-9 <= got <= demands[key] + 1e-9
    # Max-min fairness by weight: anyone below its demand has at least everyone's share per
    # weight.
    for key, got in share.items():
        if got < demands[key] - 1e-6:
            for other, theirs in share.items():
                assert got / weights[key] >= theirs / weights[other] - 1e-6


@settings(max_examples=100, deadline=None)
@given(
    claims=claims,
    pools=st.dictionaries(st.sampled_from(["k80", "p100", "v100"]), st.integers(0, 64), min_size=1),
)
def test_entitlements_hold_the_same_fraction_of_every_pool(
    claims: dict[str, tuple[float, float]], pools: dict[str, int]
) -> None:
    weights = {k: w for k, (w, _) in claims.items()}
    demands = {k: d for k, (_, d) in claims.items()}
    held = entitlements(pools, weights, demands)
    for pool, gpus in pools.items():
        assert sum(h[pool] for h in held.values()) <= gpus + 1e-6
    total = sum(pools.values())
    for user, holding in held.items():
        assert sum(holding.values()) <= demands[user] + 1e-6
        if total:
            for pool, gpus in pools.items():
                assert holding[pool] == pytest.approx(sum(holding.values()) * gpus / total)


@pytest.mark.parametrize("value", [0.0, -1.0, 1e-310, 1e300, float("inf"), float("nan")])
def test_degenerate_tickets_and_weights_are_refused_with_the_reason(value: float) -> None:
    with pytest.raises(ValueError, match=r"alice: tickets must be a finite number from 0.001 to"):
        check_tickets("alice", value)
    # A job's weight enters with its submission (the simulator's jobs have none): the event
    # contract refuses it there, before any scheduler sees it.
    job = {"user": "alice", "job_id": "j", "gpus": 1, "command": ["true"], "tickets": value}
    with pytest.raises(ValidationError, match="tickets"):
        JobSubmitted.model_validate(job)
    scheduler = MachineHarness(parse_cluster_spec("v100:1x4"), {"bob": value}, {})
    admission = scheduler.submit(JobSpec("k", "bob", 1), 0.0)
    assert not admission.accepted
    assert "user bob: tickets must be a finite number" in admission.reason


def test_tickets_within_the_bounds_pass_unchanged() -> None:
    assert check_tickets("alice", 0.001) == 0.001
    assert check_tickets("alice", 1e6) == 1e6
