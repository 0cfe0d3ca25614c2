"""Placement: fastest pool with unused share, surplus, typed rejections (docs/design.md §2.4)."""

from __future__ import annotations

from collections.abc import Mapping

from gfair.core.cluster import parse_cluster_spec
from gfair.core.placement import PoolView, choose_pool, choose_servers
from gfair.core.pools import pools_of

POOLS = pools_of(parse_cluster_spec("k80:4x4,p100:2x4,v100:2x8"))
SPEED = {"k80": 1.0, "p100": 3.0, "v100": 5.0}


def _views(
    entitled: Mapping[str, float],
    used: Mapping[str, float] | None = None,
    demand: Mapping[str, float] | None = None,
    speed: Mapping[str, float] = SPEED,
) -> list[PoolView]:
    used = used or {}
    demand = demand or {}
    return [
        PoolView(pool, speed[g], entitled.get(g, 0.0), used.get(g, 0.0), demand.get(g, 0.0))
        for g, pool in POOLS.items()
    ]


def test_fastest_pool_with_unused_entitlement_wins() -> None:
    full_v100 = {"v100": 16, "p100": 2}
    views = _views({"k80": 4, "p100": 2, "v100": 1}, used={"v100": 1}, demand=full_v100)
    choice = choose_pool(1, None, views)
    assert (choice.pool, choice.rule) == ("p100", "unused-entitlement")
    choice = choose_pool(1, None, _views({"k80": 4, "p100": 2, "v100": 1}))
    assert (choice.pool, choice.rule) == ("v100", "unused-entitlement")


def test_idle_faster_pool_beats_unused_entitlement_in_a_slower_one() -> None:
    # The user's share of V100 and P100 is used, but nobody asks for the rest of them: the job
    # takes idle V100 GPUs rather than its K80 entitlement (docs/design.md §2.4: surplus goes to
    # whoever gains from it; an uncontended cluster must not leave its fastest GPUs idle).
    used = {"p100": 2, "v100": 1}
    choice = choose_pool(1, None, _views({"k80": 4, "p100": 2, "v100": 1}, used, dict(used)))
    assert (choice.pool, choice.rule) == ("v100", "surplus")
    # A job that is slower on V100 than on the K80 it is entitled to stays on K80.
    slow_on_v100 = {"k80": 1.0, "p100": 0.8, "v100": 0.7}
    views = _views({"k80": 4, "p100": 2, "v100": 1}, used, dict(used), speed=slow_on_v100)
    assert (choose_pool(1, None, views).pool, choose_pool(1, None, views).rule) == (
        "k80",
        "unused-entitlement",
    )


def test_idle_capacity_of_a_pool_whose_share_the_user_sold_comes_after_its_entitlement() -> None:
    # The user traded all its V100 share away (it gains least there): its job takes its K80
    # entitlement, not the idle V100s; with no entitlement left anywhere, idle V100s do.
    entitled = {"k80": 4, "p100": 2, "v100": 0}
    choice = choose_pool(1, None, _views(entitled, {"p100": 2}, {"p100": 8}))
    assert (choice.pool, choice.rule) == ("k80", "unused-entitlement")
    used = {"k80": 4, "p100": 2}
    choice = choose_pool(1, None, _views(entitled, used, {"k80": 16, "p100": 8}))
    assert (choice.pool, choice.rule) == ("v100", "surplus")


def test_free_gpus_scattered_over_servers_do_not_make_a_pool_idle_for_a_gang() -> None:
    # V100 has 8 of 16 GPUs asked, but spread so that no server has 8 free: an 8-GPU job would
    # time-slice there, so it takes its K80 entitlement instead (P100 is all asked for).
    used = {"p100": 2, "v100": 1}
    views = [
        PoolView(
            pool,
            SPEED[g],
            {"k80": 8, "p100": 2, "v100": 1}[g],
            used.get(g, 0.0),
            {"p100": 8, "v100": 8}.get(g, 0.0),
            free_fit=False if g == "v100" else None,
        )
        for g, pool in POOLS.items()
    ]
    choice = choose_pool(4, None, views)
    assert (choice.pool, choice.rule) == ("k80", "unused-entitlement")


def test_fastest_is_per_job_speed_not_generation_rank() -> None:
    slow_on_v100 = {"k80": 1.0, "p100": 1.5, "v100": 0.7}  # e.g. Recommendation
    choice = choose_pool(1, None, _views({"k80": 4, "p100": 2, "v100": 1}, speed=slow_on_v100))
    assert choice.pool == "p100"


def test_idle_capacity_goes_to_whoever_places_there_when_entitlement_is_used() -> None:
    used = {"k80": 4, "p100": 2, "v100": 1}
    demand = {"k80": 16, "p100": 6, "v100": 12}
    choice = choose_pool(2, None, _views({"k80": 4, "p100": 2, "v100": 1}, used, demand))
    assert (choice.pool, choice.rule) == ("v100", "surplus")
    assert "idle GPUs" in choice.reason


def test_without_room_anywhere_the_least_oversubscribed_pool_is_chosen() -> None:
    used = {"k80": 4, "p100": 2, "v100": 1}
    demand = {"k80": 16, "p100": 8, "v100": 16}
    choice = choose_pool(1, None, _views({"k80": 4, "p100": 2, "v100": 1}, used, demand))
    assert (choice.pool, choice.rule) == ("k80", "least-oversubscribed")  # 5/4 < 3/2 < 2/1


def test_a_gang_bigger_than_every_pool_is_rejected_with_the_reason() -> None:
    choice = choose_pool(17, None, _views({"v100": 16}))
    assert not choice.accepted and choice.rule == "rejected"
    assert choice.reason == "needs 17 GPUs; largest generation (k80) has 16"
    assert {r.rule for r in choice.rejections} == {"gang-fits"}
    assert {r.pool for r in choice.rejections} == {"k80", "p100", "v100"}


def test_a_job_type_that_fits_nowhere_is_rejected_per_pool() -> None:
    nowhere = dict.fromkeys(SPEED, 0.0)
    choice = choose_pool(1, "Huge", _views({}, speed=nowhere))
    assert not choice.accepted
    assert "job type 'Huge' does not fit on k80 (zero measured throughput)" in choice.reason


def test_filtered_pools_are_reported_even_when_another_is_chosen() -> None:
    choice = choose_pool(12, None, _views({"v100": 16, "k80": 16}))
    assert choice.pool == "v100"
    assert [(r.pool, r.rule) for r in choice.rejections] == [("p100", "gang-fits")]


def test_servers_least_loaded_single_or_whole_servers_for_gangs() -> None:
    k80 = POOLS["k80"]
    load = {"k80-0": 4.0, "k80-1": 1.0, "k80-2": 1.0, "k80-3": 0.0}
    assert choose_servers(k80, 2, 1.0, load) == ("k80-3",)
    assert choose_servers(k80, 8, 1.0, load) == ("k80-3", "k80-1")
