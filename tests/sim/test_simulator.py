from __future__ import annotations

import io

import pytest

from gfair.core.cluster import parse_cluster_spec
from gfair.sim.policies.fifo import Fifo
from gfair.sim.simulator import (
    JobOutcome,
    PlanError,
    SimConfig,
    SimResult,
    SimulationStalled,
    Simulator,
)
from gfair.sim.speed import SpeedModel
from gfair.sim.timeline import TimelineWriter
from gfair.sim.trace import Trace

from .scripted import EveryQuantum, RoundRobin, Runs, Scripted
from .workloads import Row, trace_of

RESNET50 = "ResNet-50 (batch size 32)"  # V100/K80 speedup 6.2975 in the Gavel table


def outcome(result: SimResult, job_id: str) -> JobOutcome:
    return next(job for job in result.jobs if job.id == job_id)


def run(trace: Trace, spec: str, policy: object, speeds: SpeedModel, **config: object) -> SimResult:
    cluster = parse_cluster_spec(spec)
    return Simulator(trace, cluster, policy, speeds, SimConfig(**config)).run()  # type: ignore[arg-type]


def test_a_job_progresses_at_its_generation_speed(speeds: SpeedModel) -> None:
    trace = trace_of([Row(0, "a", 1, 600, RESNET50)])
    result = run(trace, "k80:1x4", Fifo(parse_cluster_spec("k80:1x4"), speeds), speeds)
    job = outcome(result, "0")
    k80 = speeds.speed(RESNET50, "k80")
    assert k80 == pytest.approx(1 / 6.2975, rel=1e-3)
    assert job.start_s == 0.0
    assert job.end_s == pytest.approx(600 / k80)
    assert job.ideal_s == pytest.approx(600 / k80)  # K80 is the only generation here
    account = result.ledger.accounts["a"]
    assert account.gpu_s == pytest.approx(600 / k80)
    assert account.work_gpu_s == pytest.approx(600)


def test_ideal_time_uses_the_fastest_generation_in_the_cluster(speeds: SpeedModel) -> None:
    trace = trace_of([Row(0, "a", 1, 600, RESNET50)])
    cluster = parse_cluster_spec("k80:1x4,v100:1x1")
    result = Simulator(trace, cluster, Fifo(cluster, speeds), speeds).run()
    assert outcome(result, "0").ideal_s == pytest.approx(600)
    assert outcome(result, "0").end_s == pytest.approx(600)  # FIFO picked the V100


def test_decisions_happen_on_quantum_boundaries(speeds: SpeedModel) -> None:
    # A holds the only GPU 0-90 s; B, submitted at 30 s, starts at the next boundary (120 s).
    trace = trace_of([Row(0, "a", 1, 90), Row(30, "b", 1, 10)])
    cluster = parse_cluster_spec("v100:1x1")
    result = Simulator(trace, cluster, Fifo(cluster, speeds), speeds).run()
    assert outcome(result, "0").end_s == 90.0
    assert outcome(result, "1").start_s == 120.0
    assert outcome(result, "1").end_s == 130.0


def test_idle_stretches_are_skipped_and_the_grid_restarts_at_the_arrival(
    speeds: SpeedModel,
) -> None:
    trace = trace_of([Row(0, "a", 1, 10), Row(1_000_007, "b", 1, 10)])
    policy = RoundRobin("v100-0")
    result = run(trace, "v100:1x1", policy, speeds)
    assert outcome(result, "1").start_s == 1_000_007.0
    assert outcome(result, "1").end_s == 1_000_017.0
    assert policy.plans == [0.0, 1_000_007.0]
    assert result.quanta == 2


def test_suspend_and_resume_cost_progress(speeds: SpeedModel) -> None:
    # Two 150 s jobs alternate on one GPU each 60 s quantum. First starts are free; every
    # resume loses 0.5 s: A 0-60, B 60-120, A 120-180 (59.5 s of work), B 180-240,
    # A finishes at 240 + 0.5 + 30.5 = 271, B at 300 + 0.5 + 30.5 = 331.
    trace = trace_of([Row(0, "a", 1, 150), Row(0, "b", 1, 150)])
    result = run(trace, "v100:1x1", RoundRobin("v100-0"), speeds)
    assert outcome(result, "0").end_s == pytest.approx(271.0)
    assert outcome(result, "1").end_s == pytest.approx(331.0)
    assert result.suspends == 4
    assert result.migrations == 0


def test_moving_a_running_job_costs_a_migration(speeds: SpeedModel) -> None:
    def script(now: float, active: list[str]) -> Runs:
        return {("v100-0" if now < 60 else "v100-1"): tuple(active)}

    trace = trace_of([Row(0, "a", 1, 200)])
    result = run(trace, "v100:2x1", Scripted(script), speeds)
    # 60 s on v100-0, then 3 s lost moving: 140 s left at 63 s, done at 203 s.
    assert outcome(result, "0").end_s == pytest.approx(203.0)
    assert result.migrations == 1
    assert result.suspends == 0


def test_switch_costs_are_configurable(speeds: SpeedModel) -> None:
    from gfair.sim.simulator import SwitchCosts

    trace = trace_of([Row(0, "a", 1, 150), Row(0, "b", 1, 150)])
    result = run(trace, "v100:1x1", RoundRobin("v100-0"), speeds, costs=SwitchCosts(resume_s=0.0))
    assert outcome(result, "0").end_s == pytest.approx(270.0)


def test_profiler_hears_each_job_once_per_generation(speeds: SpeedModel) -> None:
    def script(now: float, active: list[str]) -> Runs:
        return {("k80-0" if now < 120 else "v100-0"): tuple(active)}

    trace = trace_of([Row(0, "a", 1, 400, RESNET50)])
    policy = Scripted(script)
    run(trace, "k80:1x1,v100:1x1", policy, speeds)
    assert policy.observed == [
        ("0", "k80", pytest.approx(speeds.speed(RESNET50, "k80")), 60.0),
        ("0", "v100", pytest.approx(1.0), 180.0),
    ]


def test_rate_noise_is_seeded(speeds: SpeedModel) -> None:
    def observed(seed: int) -> list[float]:
        policy = RoundRobin("v100-0")
        trace = trace_of([Row(0, "a", 1, 500), Row(0, "b", 1, 500)])
        run(trace, "v100:1x1", policy, speeds, rate_noise=0.2, seed=seed)
        return [rate for _, _, rate, _ in policy.observed]

    assert observed(7) == observed(7)
    assert observed(7) != observed(8)
    assert all(rate != 1.0 for rate in observed(7))


def test_an_oversubscribed_server_is_refused(speeds: SpeedModel) -> None:
    trace = trace_of([Row(0, "a", 2, 100), Row(0, "b", 2, 100)])
    policy = Scripted(lambda now, active: {"v100-0": tuple(active)})
    with pytest.raises(PlanError, match=r"server v100-0 has 2 GPUs, decision uses 4"):
        run(trace, "v100:1x2", policy, speeds)


def test_a_gang_on_too_few_servers_is_refused(speeds: SpeedModel) -> None:
    trace = trace_of([Row(0, "a", 16, 100)])
    policy = Scripted(lambda now, active: {"v100-0": ("0",), "v100-1": ("0",)})
    with pytest.raises(PlanError, match=r"job 0 needs 16 GPUs"):
        run(trace, "v100:4x4", policy, speeds)


def test_unknown_jobs_and_servers_are_refused(speeds: SpeedModel) -> None:
    trace = trace_of([Row(0, "a", 1, 100)])
    with pytest.raises(PlanError, match="'ghost', which is not an admitted"):
        run(trace, "v100:1x1", Scripted(lambda now, active: {"v100-0": ("ghost",)}), speeds)
    with pytest.raises(PlanError, match="unknown server 'tpu-0'"):
        run(trace, "v100:1x1", Scripted(lambda now, active: {"tpu-0": ("0",)}), speeds)


def test_running_a_finished_job_again_is_refused(speeds: SpeedModel) -> None:
    # The script ignores `finish` and keeps listing job 0 after it completed at 30 s.
    trace = trace_of([Row(0, "a", 1, 30), Row(0, "b", 1, 300)])
    with pytest.raises(PlanError, match="'0', which is not an admitted unfinished job"):
        run(trace, "v100:2x1", Scripted(lambda n, a: {"v100-0": ("0",), "v100-1": ("1",)}), speeds)


def test_a_policy_that_never_runs_waiting_jobs_stalls(speeds: SpeedModel) -> None:
    trace = trace_of([Row(0, "a", 1, 100)])
    with pytest.raises(SimulationStalled, match="1 admitted job"):
        run(trace, "v100:1x1", Scripted(lambda now, active: {}), speeds)


def test_the_clock_can_stop_early(speeds: SpeedModel) -> None:
    trace = trace_of([Row(0, "a", 1, 1000), Row(0, "b", 1, 100)])
    cluster = parse_cluster_spec("v100:1x1")
    result = Simulator(trace, cluster, Fifo(cluster, speeds), speeds, SimConfig(until_s=300)).run()
    assert [j.status for j in result.jobs] == ["unfinished", "unfinished"]
    assert outcome(result, "0").start_s == 0.0
    assert outcome(result, "1").start_s is None
    assert result.end_s == 300.0
    assert result.ledger.accounts["a"].work_gpu_s == pytest.approx(300.0)


def test_entitlements_are_water_filled_by_demand(speeds: SpeedModel) -> None:
    # On 4 GPUs, a (one 1-GPU job) is entitled to 1 GPU; b (many jobs) to the other 3.
    trace = trace_of([Row(0, "a", 1, 600)] + [Row(0, "b", 1, 600) for _ in range(6)])
    cluster = parse_cluster_spec("v100:1x4")
    result = Simulator(trace, cluster, Fifo(cluster, speeds), speeds).run()
    a, b = result.ledger.accounts["a"], result.ledger.accounts["b"]
    assert a.active_s == pytest.approx(600)
    assert a.entitled_gpu_s / a.active_s == pytest.approx(1.0)
    # b: 3 GPUs while a is active (0-600 s), then its demand of 3 (its last three jobs).
    assert b.entitled_gpu_s == pytest.approx(3 * 600 + 3 * 600)
    assert b.gpu_s == pytest.approx(6 * 600)


def test_skipping_quiet_quanta_changes_nothing(speeds: SpeedModel) -> None:
    rows = [Row(i * 37.0, f"u{i % 3}", 1 + i % 4, 100 + 53 * i) for i in range(40)]
    trace = trace_of(rows)
    cluster = parse_cluster_spec("v100:1x8,k80:2x4")

    def replay(stepping: bool) -> tuple[tuple[JobOutcome, ...], str, int]:
        timeline = io.StringIO()
        policy = Fifo(cluster, speeds)
        sim = Simulator(
            trace,
            cluster,
            EveryQuantum(policy) if stepping else policy,
            speeds,
            timeline=TimelineWriter(timeline, cluster),
        )
        result = sim.run()
        return result.jobs, timeline.getvalue(), result.plans

    jumped, stepped = replay(stepping=False), replay(stepping=True)
    assert jumped[0] == stepped[0]
    assert jumped[1] == stepped[1]
    assert jumped[2] < stepped[2]


def test_unknown_job_types_are_reported_with_their_line(speeds: SpeedModel) -> None:
    trace = trace_of([Row(0, "a", 1, 10), Row(0, "a", 1, 10, "Quantum Chess")], source="x.csv")
    cluster = parse_cluster_spec("v100:1x1")
    with pytest.raises(ValueError, match=r"x.csv:3: column 'job_type': unknown job type"):
        Simulator(trace, cluster, Fifo(cluster, speeds), speeds)
