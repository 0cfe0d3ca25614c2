"""The decision kernel: the paper's worked examples, purity, gangs and credits."""

from __future__ import annotations

import copy

from gfair.core.cluster import parse_cluster_spec
from gfair.core.kernel import PoolState, RunnableJob, Snapshot, UserState, decide
from gfair.core.scheduler import Admitted, Node, SchedulerConfig, ServersChanged, SplitStride
from gfair.core.throughput import ThroughputEstimator

from .machine_harness import JobSpec, MachineHarness


def _schedule(
    server: str, jobs: list[tuple[str, int]], tickets: dict[str, float], quanta: int
) -> list[str]:
    """Each job its own user, queued in the given order; one string of runners per quantum."""
    scheduler = MachineHarness(
        parse_cluster_spec(server), tickets, {}, SchedulerConfig(trading=False)
    )
    for name, gpus in jobs:
        assert scheduler.submit(JobSpec(name, name, gpus), 0).accepted
    out = []
    for quantum in range(quanta):
        runs = scheduler.plan(quantum).runs
        out.append("".join(sorted(j for jobs in runs.values() for j in jobs)))
    return out


def test_stride_worked_example_four_to_one() -> None:
    # docs/design.md §2.1: A has 4 tickets, B 1, one GPU; B was queued first.
    schedule = _schedule("v100:1x1", [("B", 1), ("A", 1)], {"A": 4, "B": 1}, 9)
    assert schedule == ["B", "A", "A", "A", "A", "B", "A", "A", "A"]


def test_gang_aware_stride_worked_example() -> None:
    # docs/design.md §2.2: one 4-GPU server, one ticket each, E queued first.
    jobs = [("E", 4), ("A", 1), ("B", 1), ("C", 2), ("D", 2)]
    schedule = _schedule("v100:1x4", jobs, {}, 9)
    assert schedule == ["E", "ABC", "ABD", "ABC", "ABD", "E", "ABC", "ABD", "ABC"]


def _snapshot() -> Snapshot:
    cluster = parse_cluster_spec("v100:1x4,k80:2x4")
    pools = (
        PoolState("v100", cluster.by_generation("v100"), 0),
        PoolState("k80", cluster.by_generation("k80"), 1),
    )
    users = {
        "a": UserState("a", 1, {"v100": 2.0, "k80": 4.0}, {"v100": 0.5, "k80": -1.0}),
        "b": UserState("b", 2, {"v100": 2.0, "k80": 4.0}, {}),
    }
    speeds = {"v100": 3.0, "k80": 1.0}
    jobs = {
        "a": [RunnableJob(f"a{i}", "a", 2, i, dict(speeds), running=("k80-0",)) for i in range(3)],
        "b": [
            RunnableJob(f"b{i}", "b", 1, 10 + i, dict(speeds), home=("v100-0",)) for i in range(9)
        ],
    }
    return Snapshot(pools, users, jobs)


def test_decide_is_pure_and_deterministic() -> None:
    snapshot = _snapshot()
    before = copy.deepcopy(snapshot)
    first = decide(snapshot)
    assert snapshot == before
    assert decide(snapshot) == first
    assert first.waiting == 12 - len(first.placed)
    gpus = {j.id: j.gpus for jobs in snapshot.jobs.values() for j in jobs}
    assert sum(gpus[j] for j in first.placed) == 12  # every GPU busy, jobs waiting


def test_one_gpu_jobs_spread_over_servers_move_together_so_a_waiting_gang_runs() -> None:
    # Four one-GPU jobs of the most owed user ran two by two on two 4-GPU servers; a 4-GPU
    # gang waits. Kept where they ran, they would leave two GPUs idle on each server and the
    # gang waiting; packed onto one server, they leave the other whole for the gang.
    cluster = parse_cluster_spec("k80:2x4")
    pools = (PoolState("k80", cluster.by_generation("k80"), 0),)
    users = {
        "a": UserState("a", 1, {"k80": 4.0}, {"k80": 8.0}),
        "g": UserState("g", 2, {"k80": 4.0}, {}),
    }
    ran = ("k80-0", "k80-1", "k80-0", "k80-1")
    jobs = {
        "a": [RunnableJob(f"a{i}", "a", 1, i, {"k80": 1.0}, running=(ran[i],)) for i in range(4)],
        "g": [RunnableJob("gang", "g", 4, 9, {"k80": 1.0})],
    }
    decision = decide(Snapshot(pools, users, jobs))
    assert decision.waiting == 0
    assert len(set(decision.placed[f"a{i}"] for i in range(4))) == 1
    assert decision.placed["gang"] != decision.placed["a0"]


def _two_jobs_one_fast_gpu(waiting: bool) -> Snapshot:
    # One V100 and one K80. The stride visits user "a" first (earlier arrival); "b"'s job gains
    # ten times from a V100, "a"'s twice. With `waiting`, a third user's job waits too.
    cluster = parse_cluster_spec("v100:1x1,k80:1x1")
    pools = (
        PoolState("v100", cluster.by_generation("v100"), 0),
        PoolState("k80", cluster.by_generation("k80"), 1),
    )
    names = ["a", "b", "c"] if waiting else ["a", "b"]
    share = 1.0 / len(names)
    users = {n: UserState(n, i, {"v100": share, "k80": share}) for i, n in enumerate(names)}
    speeds = {"a": {"v100": 1.0, "k80": 0.5}, "b": {"v100": 1.0, "k80": 0.1}, "c": {"v100": 1.0}}
    jobs = {n: [RunnableJob(n + "0", n, 1, i, dict(speeds[n]))] for i, n in enumerate(names)}
    if waiting:  # "c" is owed the most, and only fits the V100
        users["c"].credit["v100"] = 2.0
    return Snapshot(pools, users, jobs)


def test_when_every_job_runs_the_fast_gpus_go_to_the_jobs_that_gain_most_there() -> None:
    decision = decide(_two_jobs_one_fast_gpu(waiting=False))
    assert decision.waiting == 0
    assert decision.placed == {"b0": ("v100-0",), "a0": ("k80-0",)}


def test_while_a_job_waits_the_stride_decides_who_runs_where() -> None:
    # The same pools with a job waiting: entitlements and credits decide, and the quantum is
    # booked; nothing is reassigned for speed.
    decision = decide(_two_jobs_one_fast_gpu(waiting=True))
    assert decision.waiting == 1
    assert decision.placed["c0"] == ("v100-0",)
    assert decision.placed["a0"] == ("k80-0",)


def test_a_job_coming_from_another_pool_does_not_take_the_place_of_one_that_stays() -> None:
    # "m" ran on the K80 and now runs on a V100; "s" ran on v100-0 and runs there again. "m"
    # is first in every order but has no place of its own in this pool: it takes the other V100
    # rather than "s"'s, which would move "s" too.
    cluster = parse_cluster_spec("v100:2x1,k80:1x1")
    pools = (
        PoolState("v100", cluster.by_generation("v100"), 0),
        PoolState("k80", cluster.by_generation("k80"), 1),
    )
    users = {n: UserState(n, i, {"v100": 1.0}) for i, n in enumerate("ms")}
    speeds = {"v100": 1.0, "k80": 0.5}
    jobs = {
        "m": [RunnableJob("m0", "m", 1, 0, dict(speeds), running=("k80-0",))],
        "s": [RunnableJob("s0", "s", 1, 1, dict(speeds), running=("v100-0",))],
    }
    decision = decide(Snapshot(pools, users, jobs))
    assert decision.placed == {"s0": ("v100-0",), "m0": ("v100-1",)}


def test_a_waiting_gang_saves_up_and_then_runs_first() -> None:
    # A 4-GPU gang beside a stream of one-GPU jobs of another user on one 4-GPU server: the
    # gang's credit grows while the small jobs run, until it is the most owed and takes the
    # server whole.
    scheduler = MachineHarness(parse_cluster_spec("k80:1x4"), {}, {}, SchedulerConfig())
    scheduler.submit(JobSpec("gang", "g", 4), 0)
    for index in range(8):
        scheduler.submit(JobSpec(f"s{index}", "s", 1), 0)
    gang_quanta = sum("gang" in scheduler.plan(q).placements for q in range(100))
    assert gang_quanta == 50  # half the server-time: both users hold equal tickets


def test_a_users_share_is_split_among_its_jobs_by_weight() -> None:
    # Weights come with live submissions only (the event contract bounds them, like tickets):
    # the machine is fed the admissions directly, its one GPU's starts and stops confirmed.
    machine = SplitStride(SchedulerConfig(), ThroughputEstimator())
    machine.apply(ServersChanged((Node("k80-0", "k80", (0,)),)))
    for job_id, weight in (("heavy", 3.0), ("light", 1.0)):
        admitted = Admitted(user="u", job_id=job_id, now=0.0, gpus=1, weight=weight, job_type=None)
        for start in (s for turn in machine.apply(admitted).starts.turns for s in turn.starts):
            machine.apply(start.started(0.0))
    ran: list[str] = []
    for quantum in range(1, 401):
        now = quantum * 60.0
        plan = machine.tick(now)
        for turn in plan.turns:
            for stop in turn.stops:
                machine.apply(stop.suspended(now))
            for start in turn.starts:
                machine.apply(start.started(now))
        held = (
            job
            for job in machine.index.resident_jobs()
            if any(s.holds_gpus for s in job.stays.values())
        )
        ran.extend(job.job_id for job in held)
    assert ran.count("heavy") == 300 and ran.count("light") == 100


def test_a_job_ending_mid_quantum_frees_its_gpus_for_the_most_owed_waiting_job() -> None:
    # One 4-GPU server, four 1-GPU users backlogged with two jobs each: each quantum runs four.
    scheduler = MachineHarness(
        parse_cluster_spec("v100:1x4"), {}, {}, SchedulerConfig(trading=False)
    )
    for user in "abcd":
        for n in range(2):
            assert scheduler.submit(JobSpec(f"{user}{n}", user, 1), 0).accepted
    plan = scheduler.plan(0)
    running = dict(plan.placements)
    assert len(running) == 4 and scheduler.fill() == {}  # every GPU busy: nothing to fill
    ended = next(iter(running))
    scheduler.finish(ended, 2)
    started = scheduler.fill()
    # One waiting job takes the freed GPU at once; the running jobs stay where they are.
    assert len(started) == 1 and set(started.values()) == {("v100-0",)}
    (job,) = started
    assert job not in running and scheduler.placement(job) == ("v100-0",)
    assert all(scheduler.placement(j) == s for j, s in running.items() if j != ended)
    # The next quantum decides from it as from any running job: it keeps its GPU.
    assert scheduler.plan(3).placements.get(job) == ("v100-0",)
