from __future__ import annotations

import pytest

from gfair.core.cluster import parse_cluster_spec
from gfair.core.throughput import ThroughputTable
from gfair.sim.policies.fifo import Fifo
from gfair.sim.policies.occupancy import Occupancy
from gfair.sim.policies.static_partition import StaticPartition, slices
from gfair.sim.policies.tiresias import Tiresias, TiresiasConfig
from gfair.sim.replay import POLICY_NAMES, ReplayOptions, replay
from gfair.sim.simulator import JobOutcome, SimConfig, SimResult, Simulator
from gfair.sim.speed import SpeedModel

from .workloads import Row, trace_of

MIXED = [
    Row(0, "ann", 1, 900, "ResNet-50 (batch size 32)"),
    Row(0, "ann", 8, 1200, "ResNet-50 (batch size 32)"),
    Row(30, "bob", 2, 600, "A3C"),
    Row(45, "bob", 16, 300),
    Row(60, "cat", 4, 2400, "Recommendation (batch size 8192)"),
    Row(61, "cat", 1, 100),
    Row(400, "ann", 1, 50),
    Row(900, "bob", 12, 700, "LM (batch size 40)"),
]


def outcome(result: SimResult, job_id: str) -> JobOutcome:
    return next(job for job in result.jobs if job.id == job_id)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_completes_a_mixed_trace(policy: str, throughput: ThroughputTable) -> None:
    trace = trace_of(MIXED)
    cluster = parse_cluster_spec("v100:2x8,k80:4x4")
    result = replay(trace, cluster, throughput, ReplayOptions(policy=policy)).result
    assert result.policy == policy
    # Three equal users' slices are 6/5/5 GPUs of each pool: bigger gangs cannot be admitted.
    too_big = 6 if policy == "static-partition" else 16
    expected = ["rejected" if job.gpus > too_big else "completed" for job in trace.jobs]
    assert [job.status for job in result.jobs] == expected
    assert expected.count("completed") >= 5
    completed = [job for job in result.jobs if job.status == "completed"]
    for job in completed:
        assert job.start_s is not None and job.end_s is not None
        assert job.submit_s <= job.start_s < job.end_s
        # Nothing runs faster than alone on its fastest generation.
        assert job.end_s - job.submit_s >= job.ideal_s - 1e-6
    work = sum(a.work_gpu_s for a in result.ledger.accounts.values())
    admitted = [job for job in trace.jobs if job.gpus <= too_big]
    assert work == pytest.approx(sum(job.gpus * job.duration_s for job in admitted))


def test_fifo_head_of_line_blocks_jobs_behind_it(speeds: SpeedModel) -> None:
    # 8 GPUs: A takes 4; B (8) must wait for A; C (1) waits behind B although 4 GPUs are free.
    trace = trace_of([Row(0, "u", 4, 600), Row(10, "u", 8, 60), Row(20, "u", 1, 60)])
    cluster = parse_cluster_spec("v100:1x8")
    result = Simulator(trace, cluster, Fifo(cluster, speeds), speeds).run()
    assert outcome(result, "1").start_s == 600.0
    assert outcome(result, "2").start_s == 660.0  # when B finished (on a boundary)


def test_fifo_prefers_the_fastest_generation_with_room(speeds: SpeedModel) -> None:
    trace = trace_of([Row(0, "u", 1, 60, "ResNet-50 (batch size 32)") for _ in range(3)])
    cluster = parse_cluster_spec("k80:1x4,v100:1x2")
    policy = Fifo(cluster, speeds)
    for job in trace.jobs:
        policy.submit(job, 0.0)
    runs = policy.plan(0.0).runs
    assert runs == {"v100-0": ("0", "1"), "k80-0": ("2",)}


def test_fifo_rejects_a_gang_larger_than_any_generation(speeds: SpeedModel) -> None:
    cluster = parse_cluster_spec("v100:1x8,k80:2x4")
    trace = trace_of([Row(0, "u", 9, 60)])
    admission = Fifo(cluster, speeds).submit(trace.jobs[0], 0.0)
    assert not admission.accepted
    assert "9 GPUs" in admission.reason


def test_slices_follow_tickets_and_add_up() -> None:
    assert slices(8, {"a": 3, "b": 1}) == {"a": 6, "b": 2}
    assert slices(10, {"a": 1, "b": 1, "c": 1}) == {"a": 4, "b": 3, "c": 3}
    parts = slices(37, {"a": 1.5, "b": 2.5, "c": 7, "d": 0.1})
    assert sum(parts.values()) == 37


def test_static_partition_never_lends_an_idle_slice(speeds: SpeedModel) -> None:
    # a owns 6 GPUs, b owns 2: b's three 1-GPU jobs run two at a time though a is idle.
    trace = trace_of(
        [Row(0, "a", 1, 60, tickets="3"), *(Row(0, "b", 1, 600, tickets="1") for _ in range(3))]
    )
    cluster = parse_cluster_spec("v100:1x8")
    policy = StaticPartition(cluster, speeds, trace.users, trace.tickets)
    assert policy.slice == {"a": {"v100": 6}, "b": {"v100": 2}}
    result = Simulator(trace, cluster, policy, speeds).run()
    starts = sorted(outcome(result, job_id).start_s or 0.0 for job_id in ("1", "2", "3"))
    assert starts == [0.0, 0.0, 600.0]


def test_static_partition_rejects_what_no_slice_can_hold(speeds: SpeedModel) -> None:
    trace = trace_of([Row(0, "a", 1, 60, tickets="3"), Row(0, "b", 4, 60, tickets="1")])
    cluster = parse_cluster_spec("v100:1x8")
    policy = StaticPartition(cluster, speeds, trace.users, trace.tickets)
    admission = policy.submit(trace.jobs[1], 0.0)
    assert not admission.accepted
    assert "exceed every slice of user b" in admission.reason


def test_tiresias_preempts_a_demoted_job_for_a_new_one(speeds: SpeedModel) -> None:
    # One GPU. A (1000 s) passes the 100 GPU-s threshold; B arrives at 200 s and takes the GPU
    # at the next decision (240 s) until it ends (290 s); A resumes at 300 s (+0.5 s).
    trace = trace_of([Row(0, "u", 1, 1000), Row(200, "u", 1, 50)])
    cluster = parse_cluster_spec("v100:1x1")
    policy = Tiresias(cluster, speeds, TiresiasConfig(thresholds_gpu_s=(100.0,)))
    result = Simulator(trace, cluster, policy, speeds).run()
    assert outcome(result, "1").start_s == 240.0
    assert outcome(result, "1").end_s == 290.0
    assert outcome(result, "0").end_s == pytest.approx(300.5 + 760)
    assert result.suspends == 1


def test_tiresias_does_not_preempt_within_the_same_queue(speeds: SpeedModel) -> None:
    trace = trace_of([Row(0, "u", 1, 500), Row(200, "u", 1, 50)])
    cluster = parse_cluster_spec("v100:1x1")
    result = Simulator(trace, cluster, Tiresias(cluster, speeds), speeds).run()
    assert outcome(result, "1").start_s == 540.0
    assert result.suspends == 0


@pytest.mark.parametrize("knob", [None, 1.0])
def test_tiresias_promotes_starving_jobs(speeds: SpeedModel, knob: float | None) -> None:
    # A long job sinks to queue 1 after a minute; then a 50 s job arrives every minute. Without
    # promotion the stream keeps the long job out; with it, the long job gets turns.
    trace = trace_of(
        [Row(0, "long", 1, 3000)] + [Row(60.0 * k, "short", 1, 50) for k in range(1, 30)]
    )
    cluster = parse_cluster_spec("v100:1x1")
    config = TiresiasConfig(thresholds_gpu_s=(60.0,), promote_knob=knob)
    policy = Tiresias(cluster, speeds, config)
    result = Simulator(trace, cluster, policy, speeds, SimConfig(until_s=1200)).run()
    done = result.ledger.accounts["long"].work_gpu_s
    if knob is None:
        assert done == pytest.approx(60.0)
    else:
        assert done > 200.0


def test_tiresias_rejects_bad_thresholds() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        TiresiasConfig(thresholds_gpu_s=(10.0, 10.0))


def test_occupancy_best_fit_keeps_whole_servers_for_gangs() -> None:
    occupancy = Occupancy(parse_cluster_spec("v100:3x8"))
    first = occupancy.place(3, ["v100"])
    second = occupancy.place(4, ["v100"])
    assert first is not None and second is not None
    assert first.servers == second.servers  # best fit: the partly used server
    gang = occupancy.place(16, ["v100"])
    assert gang is not None
    assert set(gang.servers) == {"v100-1", "v100-2"} and gang.held == 16
    assert occupancy.place(2, ["v100"]) is None
    assert occupancy.free_total == 1
    occupancy.release(gang)
    assert occupancy.free_total == 17
    assert occupancy.take(["v100-1", "v100-2"], 12) is not None
    assert occupancy.take(["v100-1"], 1) is None


def test_occupancy_counts_whole_servers_for_big_gangs() -> None:
    occupancy = Occupancy(parse_cluster_spec("v100:2x8,k80:4x4"))
    assert occupancy.held("v100", 12) == 16
    assert occupancy.held("k80", 12) == 12
    assert occupancy.held("k80", 17) is None
    assert occupancy.held("p100", 1) is None
