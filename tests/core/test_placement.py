"""Admission filters: the pools a job could ever use, typed rejections (docs/design.md §2.4)."""

from __future__ import annotations

from collections.abc import Mapping

from gfair.core.cluster import parse_cluster_spec
from gfair.core.placement import PoolView, filter_pools, rejection_reason
from gfair.core.pools import pools_of

POOLS = pools_of(parse_cluster_spec("k80:4x4,p100:2x4,v100:2x8"))
SPEED = {"k80": 1.0, "p100": 3.0, "v100": 5.0}


def _views(speed: Mapping[str, float] = SPEED) -> list[PoolView]:
    return [PoolView(pool, speed[g]) for g, pool in POOLS.items()]


def test_every_pool_the_job_fits_is_usable() -> None:
    admitted = filter_pools(8, None, _views())
    assert admitted.accepted and set(admitted.usable) == {"k80", "p100", "v100"}
    assert admitted.rejections == ()


def test_a_gang_bigger_than_every_pool_is_rejected_with_the_reason() -> None:
    views = _views()
    admitted = filter_pools(17, None, views)
    assert not admitted.accepted and admitted.rule == "gang-fits"
    assert {r.pool for r in admitted.rejections} == {"k80", "p100", "v100"}
    assert rejection_reason(17, views, admitted.rejections) == (
        "needs 17 GPUs; largest generation (k80) has 16"
    )


def test_a_job_type_that_fits_nowhere_is_rejected_per_pool() -> None:
    views = _views(dict.fromkeys(SPEED, 0.0))
    admitted = filter_pools(1, "Huge", views)
    assert not admitted.accepted and admitted.rule == "job-type-fits"
    reason = rejection_reason(1, views, admitted.rejections)
    assert "job type 'Huge' does not fit on k80 (zero measured throughput)" in reason


def test_filtered_pools_are_reported_even_when_others_are_usable() -> None:
    admitted = filter_pools(12, None, _views())
    assert set(admitted.usable) == {"k80", "v100"}
    assert [(r.pool, r.rule) for r in admitted.rejections] == [("p100", "gang-fits")]


def test_a_cluster_without_gpus_takes_nothing() -> None:
    admitted = filter_pools(1, None, [])
    assert not admitted.accepted
    assert rejection_reason(1, [], admitted.rejections) == "the cluster has no GPUs"
