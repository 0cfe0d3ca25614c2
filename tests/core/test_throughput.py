"""Throughput estimates: seeded table, observations, defaults (docs/design.md §2.4)."""

from __future__ import annotations

import pytest

from gfair.core.throughput import DEFAULT_SPEEDS, ThroughputEstimator

TABLE = {
    "ResNet": {"k80": 1.0, "p100": 4.0, "v100": 6.0},
    "Big": {"k80": 0.0, "p100": 2.0, "v100": 3.0},
}
GENS = ("k80", "p100", "v100")


def _ratio(speeds: dict[str, float], fast: str, slow: str) -> float:
    return speeds[fast] / speeds[slow]


def test_seeded_ratios_are_used_for_known_types() -> None:
    estimator = ThroughputEstimator(TABLE)
    speeds = estimator.job_speeds("j", "u", "ResNet", GENS)
    assert _ratio(speeds, "v100", "k80") == pytest.approx(6.0)
    assert _ratio(speeds, "p100", "k80") == pytest.approx(4.0)


def test_unknown_types_and_generations_use_the_documented_defaults() -> None:
    estimator = ThroughputEstimator(TABLE)
    speeds = estimator.job_speeds("j", "u", None, (*GENS, "zz9"))
    assert _ratio(speeds, "v100", "k80") == pytest.approx(DEFAULT_SPEEDS["v100"])
    assert speeds["zz9"] == pytest.approx(1.0)
    unlisted = estimator.job_speeds("j", "u", "Unlisted", GENS)
    assert _ratio(unlisted, "p100", "k80") == pytest.approx(DEFAULT_SPEEDS["p100"])
    assert estimator.fits("Unlisted", "k80") and estimator.fits(None, "k80")


def test_zero_measured_throughput_means_does_not_fit() -> None:
    estimator = ThroughputEstimator(TABLE)
    assert not estimator.fits("Big", "k80")
    assert estimator.fits("Big", "v100")
    assert estimator.job_speeds("j", "u", "Big", GENS)["k80"] == 0.0


def test_one_observation_says_nothing_two_replace_the_ratio() -> None:
    estimator = ThroughputEstimator(TABLE)
    estimator.observe("j", "u", "ResNet", "v100", 30.0)
    assert _ratio(estimator.job_speeds("j", "u", "ResNet", GENS), "v100", "k80") == pytest.approx(6)
    estimator.observe("j", "u", "ResNet", "k80", 10.0)
    speeds = estimator.job_speeds("j", "u", "ResNet", GENS)
    assert _ratio(speeds, "v100", "k80") == pytest.approx(3.0)
    # P100 was not observed: it keeps its seeded position relative to the observed pair.
    assert speeds["p100"] == pytest.approx(4.0 * (speeds["k80"] * speeds["v100"] / 6.0) ** 0.5)


def test_a_users_observations_stand_for_its_other_jobs_of_that_type() -> None:
    estimator = ThroughputEstimator(TABLE)
    estimator.observe("j1", "u", "ResNet", "k80", 10.0)
    estimator.observe("j1", "u", "ResNet", "v100", 20.0)
    fresh = estimator.job_speeds("j2", "u", "ResNet", GENS)
    assert _ratio(fresh, "v100", "k80") == pytest.approx(2.0)
    other_user = estimator.job_speeds("j3", "w", "ResNet", GENS)
    assert _ratio(other_user, "v100", "k80") == pytest.approx(6.0)


def test_observations_are_exponentially_weighted() -> None:
    estimator = ThroughputEstimator(TABLE, alpha=0.5)
    estimator.observe("j", "u", "ResNet", "k80", 10.0)
    estimator.observe("j", "u", "ResNet", "v100", 10.0)
    estimator.observe("j", "u", "ResNet", "v100", 30.0)  # mean moves halfway: 20
    speeds = estimator.job_speeds("j", "u", "ResNet", GENS)
    assert _ratio(speeds, "v100", "k80") == pytest.approx(2.0)
    with pytest.raises(ValueError, match="rate must be a finite number >= 0"):
        estimator.observe("j", "u", "ResNet", "k80", -1.0)


def test_a_users_rates_are_what_was_measured_where_it_was_measured() -> None:
    estimator = ThroughputEstimator(TABLE, alpha=0.5)
    assert estimator.user_rates("u", "ResNet") == {}
    estimator.observe("j1", "u", "ResNet", "k80", 10.0)
    estimator.observe("j2", "u", "ResNet", "k80", 20.0)
    # Its published profile: the user's mean rate on the one generation measured, no seed.
    assert estimator.user_rates("u", "ResNet") == {"k80": 15.0}
    assert estimator.user_rates("u", "A3C") == {}


def test_user_speeds_weight_job_types_by_gpus() -> None:
    estimator = ThroughputEstimator(TABLE)
    pools = dict.fromkeys(GENS, 8)
    speeds = estimator.user_speeds("u", {("ResNet", 1): 1, ("Big", 3): 3}, pools)
    # Each type normalised to its fastest generation: ResNet (1/6, 4/6, 1), Big (0, 2/3, 1).
    assert speeds["k80"] == pytest.approx((1 / 6) / 4)
    assert speeds["p100"] == pytest.approx((4 / 6 + 3 * 2 / 3) / 4)
    assert speeds["v100"] == pytest.approx(1.0)


def test_user_speeds_count_nothing_on_a_pool_a_gang_does_not_fit() -> None:
    estimator = ThroughputEstimator(TABLE)
    # A 12-GPU gang fits only the 16 K80s: V100 and P100 share would be worth nothing to it.
    pools = {"k80": 16, "p100": 4, "v100": 4}
    speeds = estimator.user_speeds("u", {("ResNet", 12): 12}, pools)
    assert speeds == {"k80": pytest.approx(1.0), "p100": 0.0, "v100": 0.0}
    # With a 1-GPU job beside it, the fast pools are worth what that job makes of them.
    mixed = estimator.user_speeds("u", {("ResNet", 12): 12, ("ResNet", 1): 4}, pools)
    assert mixed["v100"] == pytest.approx(4 / 16)
    assert mixed["k80"] == pytest.approx((12 + 4 / 6) / 16)


def test_snapshot_round_trip() -> None:
    estimator = ThroughputEstimator(TABLE)
    estimator.observe("j", "u", "ResNet", "k80", 10.0)
    estimator.observe("j", "u", None, "v100", 3.0)
    copy = ThroughputEstimator(TABLE)
    copy.restore(estimator.snapshot())
    assert copy.job_speeds("j", "u", "ResNet", GENS) == estimator.job_speeds(
        "j", "u", "ResNet", GENS
    )
    assert copy.snapshot() == estimator.snapshot()
