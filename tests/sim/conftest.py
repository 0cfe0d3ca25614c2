"""Fixtures for the simulator tests: the real Gavel table and a speed model over it."""

from __future__ import annotations

import pytest

from gfair.core.throughput import ThroughputTable
from gfair.gavel import load_throughputs
from gfair.sim.speed import SpeedModel


@pytest.fixture(scope="session")
def throughput() -> ThroughputTable:
    return load_throughputs()


@pytest.fixture(scope="session")
def speeds(throughput: ThroughputTable) -> SpeedModel:
    return SpeedModel.from_rates(throughput)
