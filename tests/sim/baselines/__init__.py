"""Tests of the paper's algorithms kept as baselines (`gfair.sim.baselines`)."""
