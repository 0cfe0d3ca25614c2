"""The `gandiva-fair` policy: the simulator drives the live service's state machine
(`SplitStride`) and decides nothing itself. Its machine's journal, fed to a fresh machine with
the same settings, gives the same plans one by one: what the simulator carried out is what the
machine decided from the inputs the simulator played (placement, auction, profiler, nodes)."""

from __future__ import annotations

import pytest

from gfair.core.cluster import parse_cluster_spec
from gfair.core.scheduler import (
    Admitted,
    CarriedOut,
    EntitlementsPublished,
    QuantumPlan,
    Recording,
    Reply,
    SplitStride,
    StopReason,
    Tick,
    TypeProfiled,
    replay,
)
from gfair.core.switch_costs import SwitchCosts
from gfair.core.throughput import ThroughputEstimator, ThroughputTable
from gfair.sim.gandiva_fair_machine import GandivaFairMachine
from gfair.sim.simulator import SimConfig, Simulator
from gfair.sim.speed import SpeedModel

from .workloads import Row, trace_of

# Every machine these tests make checks its index after every input.
pytestmark = pytest.mark.usefixtures("checked_machines")

RESNET = "ResNet-50 (batch size 32)"
A3C = "A3C"
# Three users, unequal gangs and types, arrivals into a backlog and ends: time-slicing, moves
# between pools (A3C gains little on a V100), a gang spanning servers.
ROWS = [
    Row(0, "ann", 1, 5000, RESNET),
    Row(0, "ann", 2, 8000, RESNET),
    Row(0, "ann", 4, 3000, A3C),
    Row(0, "bob", 8, 6000, RESNET),
    Row(0, "bob", 1, 9000, A3C),
    Row(0, "cat", 2, 4000, A3C),
    Row(0, "cat", 4, 7000, RESNET),
    Row(700, "cat", 1, 2000, RESNET),
    Row(1300, "ann", 4, 5000, A3C),
    Row(2000, "dan", 2, 3000, RESNET),
]
CLUSTER = "v100:2x4,k80:2x4"
QUANTUM_S = 300.0


def test_the_simulators_machine_replays_from_its_journal(
    throughput: ThroughputTable, speeds: SpeedModel
) -> None:
    cluster = parse_cluster_spec(CLUSTER)
    costs = SwitchCosts(resume_s=1.0, migration_s=60.0)
    policy = GandivaFairMachine(cluster, {}, throughput, costs=costs)
    recording = Recording()
    policy.machine.journal = recording
    config = SimConfig(quantum_s=QUANTUM_S, costs=costs)
    result = Simulator(trace_of(ROWS), cluster, policy, speeds, config).run()
    assert all(job.status == "completed" for job in result.jobs)

    fresh = SplitStride(policy.machine.config, ThroughputEstimator(throughput, alpha=1.0))
    assert replay(fresh, recording.inputs) == recording.outputs

    # The run is worth replaying: the simulator played every service the machine hears from,
    # quanta stopped jobs and started others, jobs moved, and idle GPUs were filled between
    # ticks.
    kinds = {type(given) for given in recording.inputs}
    assert {Admitted, EntitlementsPublished, TypeProfiled, CarriedOut, Tick} <= kinds
    # The nodes report every command carried out at once (`CarriedOut`): suspends, moves away
    # and starts.
    carried = [given for given in recording.inputs if isinstance(given, CarriedOut)]
    reasons = {stop.reason for given in carried for stop in given.stops}
    assert {StopReason.TIME_SLICE, StopReason.MIGRATION} <= reasons
    assert any(given.starts for given in carried)
    plans = [out for out in recording.outputs if isinstance(out, QuantumPlan)]
    assert any(turn.stops and turn.starts for plan in plans for turn in plan.turns)
    assert any(plan.placed for plan in plans)
    # The simulated nodes let go at once (`SchedulerConfig.moves_at_once`): every job a quantum
    # places on other servers starts in that quantum's own plan, none waits for its release
    # report.
    for plan in plans:
        started = {start.job_id for turn in plan.turns for start in turn.starts}
        assert {placement.job_id for placement in plan.placed} <= started
    assert any(isinstance(out, Reply) and out.starts.turns for out in recording.outputs)
    assert result.migrations > 0
