"""A job's measured switches become the costs the kernel weighs (`MeasuredSwitches.charged`)."""

from __future__ import annotations

import pytest

from gfair.core.switch_costs import MeasuredSwitches, SwitchCosts

OPERATOR = SwitchCosts(resume_s=0.5, migration_s=30.0)


def test_nothing_measured_charges_the_operators_costs() -> None:
    assert MeasuredSwitches().charged(OPERATOR, parked=True) == OPERATOR
    # A cold start without a yield is half a switch: still the operator's.
    assert MeasuredSwitches(cold_start_s=90.0).charged(OPERATOR, parked=False) == OPERATOR


def test_a_resume_is_the_yield_and_the_restart_it_takes() -> None:
    measured = MeasuredSwitches(yield_s=2.0, resume_in_place_s=0.3, cold_start_s=50.0)
    assert measured.charged(OPERATOR, parked=True).resume_s == pytest.approx(2.3)
    assert measured.charged(OPERATOR, parked=False).resume_s == pytest.approx(52.0)
    # Parked, but no in-place resume measured yet: the operator's.
    unmeasured = MeasuredSwitches(yield_s=2.0, cold_start_s=50.0)
    assert unmeasured.charged(OPERATOR, parked=True).resume_s == 0.5


def test_a_move_costs_what_was_measured_but_never_less_than_the_operator_says() -> None:
    dear = MeasuredSwitches(yield_s=2.0, cold_start_s=50.0)
    assert dear.charged(OPERATOR, parked=True).migration_s == pytest.approx(52.0)
    cheap = MeasuredSwitches(yield_s=0.5, cold_start_s=3.0)
    assert cheap.charged(OPERATOR, parked=False).migration_s == 30.0
