from __future__ import annotations

import pytest

from gfair.core.throughput import DEFAULT_SPEEDS, ThroughputTable
from gfair.sim.speed import SpeedModel, UnknownJobType


def test_speeds_are_gavel_rates_relative_to_the_v100(
    speeds: SpeedModel, throughput: ThroughputTable
) -> None:
    rates = throughput["CycleGAN"]
    assert speeds.speed("CycleGAN", "v100") == 1.0
    assert speeds.speed("CycleGAN", "k80") == pytest.approx(rates["k80"] / rates["v100"])
    assert speeds.speed("CycleGAN", "p100") == pytest.approx(rates["p100"] / rates["v100"])
    # Recommendation models run faster on a K80 than on a V100 in the table.
    assert speeds.speed("Recommendation (batch size 1024)", "k80") > 1.0


def test_unknown_types_use_the_cores_default_speeds(speeds: SpeedModel) -> None:
    assert speeds.speed(None, "v100") == 1.0
    assert speeds.speed(None, "k80") == pytest.approx(
        DEFAULT_SPEEDS["k80"] / DEFAULT_SPEEDS["v100"]
    )
    assert speeds.speed(None, "a100") == pytest.approx(
        DEFAULT_SPEEDS["a100"] / DEFAULT_SPEEDS["v100"]
    )
    # A measured type on an unmeasured generation falls back to the generation default.
    assert speeds.speed("CycleGAN", "h100") == speeds.speed(None, "h100")
    assert speeds.speed(None, "tpu9") == pytest.approx(1 / DEFAULT_SPEEDS["v100"])


def test_types_without_a_v100_rate_are_left_out() -> None:
    model = SpeedModel.from_rates({"odd": {"k80": 2.0, "v100": 0.0}, "ok": {"v100": 2.0}})
    assert model.job_types == ("ok",)
    with pytest.raises(UnknownJobType):
        model.check("odd")
    model.check(None)


def test_gangs_run_at_their_slowest_member_and_ranking_is_fastest_first(
    speeds: SpeedModel,
) -> None:
    job = "ResNet-50 (batch size 32)"
    assert speeds.gang_speed(job, ["v100", "k80"]) == speeds.speed(job, "k80")
    assert speeds.ranked(job, ("k80", "p100", "v100")) == ("v100", "p100", "k80")
    rec = "Recommendation (batch size 1024)"
    assert speeds.ranked(rec, ("k80", "p100", "v100"))[0] == "p100"
    assert speeds.fastest(job, ["k80", "p100"]) == speeds.speed(job, "p100")
