"""The simulator honours job arrays' limits and dependencies (gfair.core.arrays, .dependencies)."""

from __future__ import annotations

import pytest

from gfair.core.cluster import parse_cluster_spec
from gfair.core.scheduler import SchedulerConfig
from gfair.core.throughput import ThroughputTable
from gfair.sim.gandiva_fair_machine import GandivaFairMachine
from gfair.sim.replay import ReplayOptions, build_policy
from gfair.sim.simulator import JobOutcome, SimConfig, SimResult, Simulator
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import Trace, TraceJob

RESNET = "ResNet-50 (batch size 32)"


def _run(jobs: list[TraceJob], throughput: ThroughputTable, speeds: SpeedModel) -> SimResult:
    cluster = parse_cluster_spec("v100:1x8")
    trace = Trace(
        jobs=tuple(sorted(jobs, key=lambda j: j.submit_s)), tickets={}, source="t", format="gfair"
    )
    policy = GandivaFairMachine(cluster, {}, throughput, SchedulerConfig(trading=False))
    return Simulator(trace, cluster, policy, speeds, SimConfig(quantum_s=60)).run()


def _by_id(result: SimResult) -> dict[str, JobOutcome]:
    return {job.id: job for job in result.jobs}


def _most_at_once(jobs: list[JobOutcome]) -> int:
    edges = sorted([(j.start_s, 1) for j in jobs] + [(j.end_s, -1) for j in jobs])  # type: ignore[list-item]
    most = running = 0
    for _, step in edges:  # an end before a start at the same instant: (t, -1) < (t, 1)
        running += step
        most = max(most, running)
    return most


def test_an_array_runs_at_most_its_limit_and_the_cluster_stays_busy_with_other_work(
    throughput: ThroughputTable, speeds: SpeedModel
) -> None:
    members = [
        TraceJob(f"s-{i}", "alice", 1, 0.0, 600.0, RESNET, array="s", array_limit=3)
        for i in range(9)
    ]
    others = [TraceJob(f"b-{i}", "bob", 1, 0.0, 1800.0, RESNET) for i in range(5)]
    outcomes = _by_id(_run(members + others, throughput, speeds))
    array = [outcomes[f"s-{i}"] for i in range(9)]
    assert all(j.status == "completed" for j in outcomes.values())
    assert _most_at_once(array) == 3  # 8 GPUs, yet never more than 3 of the array
    # bob's five jobs run from the start on the GPUs the array leaves: nothing idles for it.
    assert all(outcomes[f"b-{i}"].start_s == 0.0 for i in range(5))


def test_a_dependent_job_starts_only_after_its_dependencies_complete_and_chains_follow(
    throughput: ThroughputTable, speeds: SpeedModel
) -> None:
    jobs = [
        TraceJob("prep", "alice", 1, 0.0, 900.0, RESNET),
        TraceJob("other", "alice", 1, 0.0, 300.0, RESNET),
        TraceJob("train", "alice", 2, 10.0, 600.0, RESNET, after_ok=("prep", "other")),
        TraceJob("eval", "alice", 1, 20.0, 60.0, RESNET, after_ok=("train",)),
        TraceJob("late", "alice", 1, 2000.0, 60.0, RESNET, after_ok=("prep",)),
        TraceJob("orphan", "alice", 1, 30.0, 60.0, RESNET, after_ok=("ghost",)),
        TraceJob("too-big", "alice", 64, 0.0, 60.0, RESNET),
        TraceJob("doomed", "alice", 1, 40.0, 60.0, RESNET, after_ok=("too-big",)),
    ]
    outcomes = _by_id(_run(jobs, throughput, speeds))
    prep, train, evaluation = outcomes["prep"], outcomes["train"], outcomes["eval"]
    assert train.status == evaluation.status == "completed"
    assert prep.end_s is not None and train.start_s is not None and train.end_s is not None
    assert train.start_s >= prep.end_s  # held while prep ran, though 6 GPUs stayed free
    assert evaluation.start_s is not None and evaluation.start_s >= train.end_s
    assert outcomes["late"].start_s == 2000.0  # its dependency had completed: no wait
    assert outcomes["orphan"].status == "rejected"
    assert "ghost" in outcomes["orphan"].reason
    assert outcomes["doomed"].status == "rejected"
    assert "dependency too-big rejected" in outcomes["doomed"].reason


@pytest.mark.parametrize("policy", ["fifo", "tiresias", "max-min-fairness", "static-partition"])
def test_every_baseline_policy_is_held_to_an_arrays_limit_too(
    throughput: ThroughputTable, speeds: SpeedModel, policy: str
) -> None:
    """The comparison is fair: a user's `%N` binds every policy, not only gandiva-fair."""
    members = [
        TraceJob(f"s-{i}", "alice", 1, 0.0, 600.0, RESNET, array="s", array_limit=3)
        for i in range(9)
    ]
    trace = Trace(jobs=tuple(members), tickets={}, source="t", format="gfair")
    cluster = parse_cluster_spec("v100:1x8")
    options = ReplayOptions(policy=policy, quantum_s=60)
    chosen = build_policy(policy, cluster, trace, speeds, throughput, options)
    result = Simulator(trace, cluster, chosen, speeds, SimConfig(quantum_s=60)).run()
    array = list(_by_id(result).values())
    assert all(j.status == "completed" for j in array)
    assert _most_at_once(array) == 3
