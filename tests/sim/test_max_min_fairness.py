"""Heterogeneity-aware max-min fairness: the program on hand-computed cases, the rounds, and
decisions the simulator accepts."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest

from gfair.core.cluster import Cluster, parse_cluster_spec
from gfair.core.throughput import ThroughputTable
from gfair.sim.policies.max_min_fairness import MaxMinConfig, MaxMinFairness, max_min_allocation
from gfair.sim.policy import Admission, PolicyDecision
from gfair.sim.replay import ReplayOptions, replay
from gfair.sim.simulator import SimConfig, Simulator
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import Trace, TraceJob

from .workloads import Row, backlog, trace_of


def solve(
    speed: list[list[float]],
    gpus: list[int],
    capacity: list[int],
    weight: list[float] | None = None,
    *,
    pareto: bool = True,
) -> tuple[np.ndarray, float]:
    """One class per job; gangs fit one server (held = gpus)."""
    speeds = np.array(speed, dtype=float)
    held = np.where(speeds > 0, np.array(gpus, dtype=float)[:, None], 0.0)
    allocation = max_min_allocation(
        speeds,
        held,
        np.array(gpus, dtype=float),
        np.array(weight or [1.0] * len(gpus)),
        np.ones(len(gpus)),
        np.array(capacity, dtype=float),
        pareto=pareto,
    )
    return allocation.x, allocation.t


def normalised(
    x: np.ndarray, speed: list[list[float]], gpus: list[int], capacity: list[int]
) -> np.ndarray:
    s = np.array(speed)
    equal = (s @ np.array(capacity, dtype=float)) / (len(gpus) * np.array(gpus, dtype=float))
    return (x * s).sum(axis=1) / equal


def test_two_jobs_that_prefer_different_generations_each_get_their_favourite() -> None:
    # One V100 and one K80. A runs at 1 and 0.5; B (a Recommendation-like model) at 1 and 1.5.
    # Equal shares: E_A = (1 + 0.5)/2 = 0.75, E_B = (1 + 1.5)/2 = 1.25. Giving each its favourite
    # whole: r_A = 1/0.75 = 1.33, r_B = 1.5/1.25 = 1.2, and B cannot do better (it runs all the
    # time on its fastest GPU), so t = 1.2.
    speed = [[1.0, 0.5], [1.0, 1.5]]
    x, t = solve(speed, [1, 1], [1, 1])
    assert t == pytest.approx(1.2)
    assert x == pytest.approx(np.array([[1.0, 0.0], [0.0, 1.0]]), abs=1e-6)


def test_equal_normalised_throughput_on_a_contended_mix() -> None:
    # One V100 and one K80, two jobs that both prefer the V100 (2x and 4x). The optimum is
    # a = 0.5 (hand-solved: (0.5 + 0.5a)/0.75 = (1 - 0.75a)/0.625), both normalised at exactly 1.
    speed = [[1.0, 0.5], [1.0, 0.25]]
    x, t = solve(speed, [1, 1], [1, 1])
    assert t == pytest.approx(1.0)
    r = normalised(x, speed, [1, 1], [1, 1])
    assert r == pytest.approx([1.0, 1.0], abs=1e-5)
    assert x.sum(axis=0) == pytest.approx([1.0, 1.0], abs=1e-6)  # nothing left idle


def test_weights_split_time_in_proportion() -> None:
    # One GPU, two identical jobs weighted 3:1: x = 0.75 / 0.25 and t = 1.
    x, t = solve([[1.0], [1.0]], [1, 1], [1], weight=[3.0, 1.0])
    assert t == pytest.approx(1.0)
    assert x[:, 0] == pytest.approx([0.75, 0.25], abs=1e-6)


def test_a_gang_gets_the_gpu_time_of_as_many_one_gpu_jobs() -> None:
    # Two GPUs: a 2-GPU gang and two 1-GPU jobs. E = 1/3 for the gang, 2/3 for the others;
    # 3 x_A = 1.5 x_B = 1.5 x_C and 2 x_A + x_B + x_C = 2 give x_A = 1/3, x_B = x_C = 2/3:
    # 2/3 of a GPU each.
    x, t = solve([[1.0], [1.0], [1.0]], [2, 1, 1], [2])
    assert t == pytest.approx(1.0)
    assert x[:, 0] == pytest.approx([1 / 3, 2 / 3, 2 / 3], abs=1e-6)


def test_the_second_stage_hands_out_what_the_bottleneck_leaves() -> None:
    # Three V100s, two jobs: each can use one GPU at most, so stage 1 is pinned at x = 1 for
    # both either way; with a K80 whose only taker is A, stage 2 must not leave A's time split.
    speed = [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]
    x, t = solve(speed, [1, 1, 1], [2, 1])
    assert x.sum(axis=1) == pytest.approx([1.0, 1.0, 1.0], abs=1e-6)
    # And without stage 2 the bottleneck value is the same.
    _, plain = solve(speed, [1, 1, 1], [2, 1], pareto=False)
    assert plain == pytest.approx(t)


def test_identical_jobs_share_one_class_and_one_allocation(speeds: SpeedModel) -> None:
    cluster = parse_cluster_spec("v100:1x4,k80:1x4")
    policy = MaxMinFairness(cluster, speeds, {})
    trace = backlog(["a", "b", "c"], 3, job_types={u: "A3C" for u in "abc"})
    for job in trace.jobs:
        assert policy.submit(job, 0.0).accepted
    policy.plan(0.0)
    allocation = policy.allocation()
    assert len({tuple(sorted(row.items())) for row in allocation.values()}) == 1
    # 9 equal 1-GPU jobs, 8 GPUs: each gets 8/9 of a GPU-round; the V100s go first.
    row = next(iter(allocation.values()))
    assert sum(row.values()) == pytest.approx(8 / 9, abs=1e-6)
    assert policy.solves == 1


def test_rounds_realise_the_allocation(speeds: SpeedModel, throughput: ThroughputTable) -> None:
    # Backlogged jobs that each like a different generation; over many rounds, the fraction of
    # rounds each job ran on each generation approaches its X.
    types = {
        "a": "ResNet-50 (batch size 32)",  # 6.3x from a V100
        "b": "LM (batch size 40)",  # 3.9x
        "c": "A3C",  # 2.1x
        "d": "Recommendation (batch size 8192)",  # 1.05x, and a P100 beats the V100
    }
    trace = backlog(list(types), 2, job_types=types)
    cluster = parse_cluster_spec("v100:1x2,p100:1x2,k80:1x2")
    policy = MaxMinFairness(cluster, speeds, {})
    for job in trace.jobs:
        policy.submit(job, 0.0)
    counts: dict[tuple[str, str], int] = {}
    rounds = 400
    generation_of = {server.id: server.generation for server in cluster.servers}
    for index in range(rounds):
        for server, jobs in policy.plan(index * 360.0).runs.items():
            for job in jobs:
                key = (job, generation_of[server])
                counts[key] = counts.get(key, 0) + 1
    for job, row in policy.allocation().items():
        for generation, share in row.items():
            assert counts.get((job, generation), 0) / rounds == pytest.approx(share, abs=0.03)


def test_jobs_only_run_where_their_type_fits() -> None:
    # "Big" has no K80 rate (does not fit there): it waits rather than take an idle K80.
    speeds = SpeedModel.from_rates({"Big": {"v100": 2.0, "k80": 0.0}, "Small": {"v100": 1.0}})
    cluster = parse_cluster_spec("v100:1x1,k80:1x1")
    policy = MaxMinFairness(cluster, speeds, {})
    trace = trace_of([Row(0, "u", 1, 1e6, "Big"), Row(0, "v", 1, 1e6, "Big")])
    for job in trace.jobs:
        policy.submit(job, 0.0)
    for index in range(10):
        runs = policy.plan(index * 60.0).runs
        assert "k80-0" not in runs
        assert len(runs["v100-0"]) == 1
    assert all(row["k80"] == 0.0 for row in policy.allocation().values())


def test_gangs_that_fit_no_generation_are_rejected(speeds: SpeedModel) -> None:
    cluster = parse_cluster_spec("v100:2x4,k80:1x4")
    policy = MaxMinFairness(cluster, speeds, {})
    trace = trace_of([Row(0, "u", 9, 60), Row(0, "u", 8, 60)])
    rejected = policy.submit(trace.jobs[0], 0.0)
    assert not rejected.accepted and "9 GPUs" in rejected.reason
    assert policy.submit(trace.jobs[1], 0.0).accepted
    runs = policy.plan(0.0).runs
    assert runs == {"v100-0": ("1",), "v100-1": ("1",)}  # whole servers of the one pool


@pytest.mark.parametrize("seed", range(6))
def test_random_traces_run_to_completion_with_no_fitting_job_left_waiting(
    seed: int, speeds: SpeedModel
) -> None:
    """The simulator checks every decision (servers, capacity, gangs); after each decision no
    waiting job fits the GPUs left free on any generation it can run on."""
    rng = random.Random(seed)
    types = [*speeds.job_types, None]
    rows = [
        Row(
            rng.uniform(0, 20_000),
            f"u{rng.randrange(5)}",
            rng.choice((1, 1, 1, 2, 3, 4, 6, 8, 12)),
            rng.uniform(60, 30_000),
            rng.choice(types) or "",
            "",
        )
        for _ in range(60)
    ]
    trace = trace_of(sorted(rows, key=lambda row: row.submit_s))
    cluster = parse_cluster_spec("v100:2x4,p100:1x8,k80:3x4")
    policy = MaxMinFairness(cluster, speeds, {"u0": 3.0, "u1": 2.0})
    checked = _WorkConservationCheck(policy, cluster, trace)
    result = Simulator(trace, cluster, checked, speeds, SimConfig(quantum_s=360.0)).run()
    assert all(job.status == "completed" for job in result.jobs)
    work = sum(a.work_gpu_s for a in result.ledger.accounts.values())
    assert work == pytest.approx(sum(job.gpus * job.duration_s for job in trace.jobs))
    assert checked.decisions > 0


class _WorkConservationCheck:
    """Wraps the policy; after each decision, checks that no waiting job could have run."""

    def __init__(self, policy: MaxMinFairness, cluster: Cluster, trace: Trace) -> None:
        self.policy = policy
        self.name = policy.name
        self.cluster = cluster
        self.speeds = policy._speeds
        self.jobs = {job.id: job for job in trace.jobs}
        self.active: set[str] = set()
        self.decisions = 0

    def submit(self, job: TraceJob, now: float) -> Admission:
        admission = self.policy.submit(job, now)
        if admission.accepted:
            self.active.add(job.id)
        return admission

    def finish(self, job_id: str, now: float) -> None:
        self.active.discard(job_id)
        self.policy.finish(job_id, now)

    def observe(self, job_id: str, generation: str, rate: float, now: float) -> None:
        self.policy.observe(job_id, generation, rate, now)

    def quiet_until(self, now: float) -> float:
        return self.policy.quiet_until(now)

    def plan(self, now: float) -> PolicyDecision:
        decision = self.policy.plan(now)
        self.decisions += 1
        servers_of: dict[str, list[str]] = {}
        for server, jobs in decision.runs.items():
            for job_id in jobs:
                servers_of.setdefault(job_id, []).append(server)
        used: dict[str, int] = {}
        for job_id, servers in servers_of.items():
            for server in servers:
                whole = self.cluster.server(server).gpus
                held = whole if len(servers) > 1 else self.jobs[job_id].gpus
                used[server] = used.get(server, 0) + held
        free = {s.id: s.gpus - used.get(s.id, 0) for s in self.cluster.servers}
        for job_id in self.active - set(servers_of):
            job = self.jobs[job_id]
            measured = self.speeds.by_type.get(job.job_type) if job.job_type else None
            for generation in self.cluster.generations:
                if measured is not None and generation not in measured:
                    continue
                pool = self.cluster.by_generation(generation)
                if job.gpus <= self.cluster.largest_server(generation):
                    assert all(free[s.id] < job.gpus for s in pool), (now, job_id, free)
                else:
                    idle = sum(s.gpus for s in pool if free[s.id] == s.gpus)
                    assert idle < job.gpus, (now, job_id, generation, free)
        return decision


def test_replay_by_name_weights_users_by_tickets(throughput: ThroughputTable) -> None:
    # Two backlogged users on one V100 server, tickets 3:1, several jobs each: time 75/25.
    trace = backlog(["rich", "poor"], 4, tickets={"rich": 3, "poor": 1})
    outcome = replay(
        trace,
        parse_cluster_spec("v100:1x4"),
        throughput,
        ReplayOptions(
            policy="max-min-fairness", quantum_s=360.0, until_s=360.0 * 200, series_bucket_s=3600
        ),
    )
    series = outcome.series
    assert series is not None
    measured = series.window(3600.0, 360.0 * 200)
    assert measured["rich"].received_share == pytest.approx(0.75, abs=0.02)
    assert measured["poor"].received_share == pytest.approx(0.25, abs=0.02)


def test_without_the_second_stage_the_policy_still_runs(speeds: SpeedModel) -> None:
    trace = trace_of([Row(0, "a", 1, 3_600, "A3C"), Row(0, "b", 2, 7_200, "LM (batch size 40)")])
    cluster = parse_cluster_spec("v100:1x2,k80:1x4")
    policy = MaxMinFairness(cluster, speeds, {}, config=MaxMinConfig(pareto=False))
    result = Simulator(trace, cluster, policy, speeds, SimConfig(quantum_s=360.0)).run()
    assert [job.status for job in result.jobs] == ["completed", "completed"]


def test_decisions_hold_until_the_next_event_once_everyone_runs_whole(
    speeds: SpeedModel,
) -> None:
    cluster = parse_cluster_spec("v100:1x4,k80:1x4")
    policy = MaxMinFairness(cluster, speeds, {})
    for job in backlog(["a", "b"], 1, job_types={"a": "A3C", "b": "A3C"}).jobs:
        policy.submit(job, 0.0)
    policy.plan(0.0)
    assert policy.quiet_until(0.0) == math.inf  # both on V100s all the time
    for job in backlog(["c", "d", "e", "f"], 2, job_types={u: "A3C" for u in "cdef"}).jobs:
        policy.submit(replace(job, id=f"x{job.id}-{job.user}"), 0.0)
    policy.plan(360.0)
    assert policy.quiet_until(360.0) == -math.inf  # 10 jobs, 8 GPUs: the rounds time-slice
    # Skipping the quiet quanta gives what stepping every quantum gives.
    trace = trace_of(
        [Row(0, "a", 1, 5_000, "A3C"), Row(4_000, "b", 2, 3_000, "LM (batch size 40)")]
    )
    results = []
    for settle in (True, False):
        runner = MaxMinFairness(cluster, speeds, {})
        if not settle:
            runner.quiet_until = lambda now: -math.inf  # type: ignore[method-assign]
        results.append(Simulator(trace, cluster, runner, speeds, SimConfig(quantum_s=360.0)).run())
    assert [j.end_s for j in results[0].jobs] == [j.end_s for j in results[1].jobs]
    assert results[0].plans < results[1].plans
