"""Gandiva-fair end to end, the split-stride state machine as the simulator drives it
(`machine_harness`): admission, quanta, gangs, shares and trading, and per decision the
invariants (gangs whole, no server over-committed, work conservation) under random arrivals,
ends and profiles."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfair.core.cluster import parse_cluster_spec
from gfair.core.scheduler import SchedulerConfig

from .machine_harness import JobSpec, MachineHarness, Plan

TABLE = {
    "Fast": {"k80": 1.0, "p100": 4.0, "v100": 8.0},
    "Flat": {"k80": 1.0, "p100": 1.5, "v100": 0.7},
    "NoK80": {"k80": 0.0, "p100": 1.0, "v100": 2.0},
}


def _check(scheduler: MachineHarness, plan: Plan, sizes: dict[str, int]) -> None:
    cluster = scheduler.cluster
    for server_id, jobs in plan.runs.items():
        assert all(server_id in plan.placements[j] for j in jobs)
        spanning = [j for j in jobs if len(plan.placements[j]) > 1]
        if spanning:
            assert list(jobs) == spanning and len(jobs) == 1
        else:
            assert sum(sizes[j] for j in jobs) <= cluster.server(server_id).gpus
    for job, servers in plan.placements.items():
        generations = {cluster.server(s).generation for s in servers}
        assert len(generations) == 1
        assert sum(cluster.server(s).gpus for s in servers) >= sizes[job]
        running = [s for s in servers if job in plan.runs.get(s, ())]
        assert running in ([], list(servers))  # a gang runs whole or not at all


def test_admission_accepts_what_some_pool_can_run_or_says_why_not() -> None:
    scheduler = MachineHarness(parse_cluster_spec("v100:2x8,k80:2x4"), {}, TABLE)
    ok = scheduler.submit(JobSpec("a", "u", 2, "Fast"), 0)
    assert ok.accepted and ok.pool == "v100", ok
    assert scheduler.plan(0).placements["a"] in {("v100-0",), ("v100-1",)}
    too_big = scheduler.submit(JobSpec("b", "u", 17), 0)
    assert not too_big.accepted and too_big.rule == "gang-fits"
    assert too_big.reason == "needs 17 GPUs; largest generation (v100) has 16"
    assert not scheduler.submit(JobSpec("a", "u", 1), 0).accepted
    assert "gpus must be >= 1" in scheduler.submit(JobSpec("c", "u", 0), 0).reason
    assert "b" not in scheduler.plan(1).placements


def test_a_job_type_that_does_not_fit_a_generation_never_goes_there() -> None:
    scheduler = MachineHarness(parse_cluster_spec("k80:4x8,p100:1x1"), {}, TABLE)
    placed = [scheduler.submit(JobSpec(f"j{i}", "u", 1, "NoK80"), 0) for i in range(4)]
    assert {a.pool for a in placed} == {"p100"}
    refused = scheduler.submit(JobSpec("big", "u", 2, "NoK80"), 0)
    assert not refused.accepted
    assert "does not fit on k80" in refused.reason and "p100 has 1 in all" in refused.reason
    for quantum in range(8):
        plan = scheduler.plan(quantum)
        assert set(plan.runs) == {"p100-0"} and len(plan.runs["p100-0"]) == 1


def test_a_multi_server_job_takes_whole_servers_of_one_generation() -> None:
    scheduler = MachineHarness(parse_cluster_spec("k80:4x8"), {}, TABLE)
    scheduler.submit(JobSpec("gang", "u", 12), 0)
    for index in range(6):
        scheduler.submit(JobSpec(f"s{index}", "w", 4), 0)
    sizes = {"gang": 12} | {f"s{i}": 4 for i in range(6)}
    ran = 0
    for quantum in range(20):
        plan = scheduler.plan(quantum)
        _check(scheduler, plan, sizes)
        if "gang" in plan.placements:
            assert len(plan.placements["gang"]) == 2
            ran += 1
        _assert_work_conserving(scheduler, plan, sizes)
    assert 0 < ran < 20


def test_users_share_a_homogeneous_cluster_by_tickets() -> None:
    scheduler = MachineHarness(parse_cluster_spec("k80:2x4"), {"a": 1, "b": 3}, TABLE)
    for index in range(12):
        scheduler.submit(JobSpec(f"a{index}", "a", 1), 0)
        scheduler.submit(JobSpec(f"b{index}", "b", 1), 0)
    gpu_time = {"a": 0, "b": 0}
    for quantum in range(400):
        for jobs in scheduler.plan(quantum).runs.values():
            for job in jobs:
                gpu_time[job[0]] += 1
    assert gpu_time["a"] + gpu_time["b"] == 400 * 8
    assert gpu_time["b"] / gpu_time["a"] == pytest.approx(3.0, rel=0.05)


def test_a_user_asking_less_than_its_share_gets_all_it_asks() -> None:
    scheduler = MachineHarness(parse_cluster_spec("k80:1x8"), {}, TABLE)
    scheduler.submit(JobSpec("small", "light", 1), 0)
    for index in range(20):
        scheduler.submit(JobSpec(f"h{index}", "heavy", 1), 0)
    ran = sum("small" in scheduler.plan(q).runs.get("k80-0", ()) for q in range(100))
    assert scheduler.entitlements()["light"]["k80"] == pytest.approx(1.0)
    assert scheduler.entitlements()["heavy"]["k80"] == pytest.approx(7.0)
    assert ran >= 95


def test_finish_frees_the_job_and_unknown_ids_are_an_error() -> None:
    scheduler = MachineHarness(parse_cluster_spec("k80:1x4"), {}, TABLE)
    scheduler.submit(JobSpec("a", "u", 1), 0)
    scheduler.finish("a", 1)
    assert scheduler.plan(2).placements == {}
    assert scheduler.entitlements() == {}
    with pytest.raises(KeyError, match="unknown job 'a'"):
        scheduler.finish("a", 3)


def test_pool_entitlements_add_up_and_trading_moves_fast_share_to_fast_users() -> None:
    cluster = parse_cluster_spec("v100:1x4,p100:1x4,k80:4x4")
    scheduler = MachineHarness(cluster, {}, TABLE)
    for index in range(12):
        scheduler.submit(JobSpec(f"f{index}", "fast", 1, "Fast"), 0)
        scheduler.submit(JobSpec(f"s{index}", "flat", 1, "Flat"), 0)
    plan = scheduler.plan(0)
    held = scheduler.entitlements()
    for generation, gpus in cluster.gpus_per_generation().items():
        assert sum(h[generation] for h in held.values()) == pytest.approx(gpus)
    assert held["fast"]["v100"] == pytest.approx(4.0)
    assert held["flat"]["v100"] == pytest.approx(0.0)
    assert plan.trades > 0
    without = MachineHarness(cluster, {}, TABLE, SchedulerConfig(trading=False))
    for index in range(12):
        without.submit(JobSpec(f"f{index}", "fast", 1, "Fast"), 0)
        without.submit(JobSpec(f"s{index}", "flat", 1, "Flat"), 0)
    assert without.plan(0).trades == 0
    untraded = without.entitlements()
    assert untraded["flat"]["v100"] == pytest.approx(2.0)
    # Flat sold its V100 share to fast, for more than it held of the slow pools.
    assert held["flat"]["k80"] > untraded["flat"]["k80"] + 1


def _effective_work(trading: bool) -> dict[str, float]:
    # Four users of different speedups on a mixed cluster (the paper's trading experiment, small).
    table = {
        "u1": {"k80": 1.0, "p100": 4.8, "v100": 8.8},
        "u2": {"k80": 1.0, "p100": 3.9, "v100": 5.0},
        "u3": {"k80": 1.0, "p100": 3.4, "v100": 3.8},
        "u4": {"k80": 1.0, "p100": 1.5, "v100": 0.7},
    }
    scheduler = MachineHarness(
        parse_cluster_spec("v100:3x4,p100:3x8,k80:16x8"),
        {},
        table,
        SchedulerConfig(trading=trading),
    )
    sizes: dict[str, int] = {}
    for user in table:
        for index in range(60):
            sizes[f"{user}-{index}"] = [1, 1, 2, 4][index % 4]
            scheduler.submit(JobSpec(f"{user}-{index}", user, sizes[f"{user}-{index}"], user), 0)
    work = dict.fromkeys(table, 0.0)
    for quantum in range(200):
        for server, jobs in scheduler.plan(quantum).runs.items():
            generation = scheduler.cluster.server(server).generation
            for job in jobs:
                user = job.split("-")[0]
                work[user] += table[user][generation] * sizes[job]
    return work


def test_trading_helps_the_extreme_users_and_hurts_nobody() -> None:
    before, after = _effective_work(False), _effective_work(True)
    gain = {user: after[user] / before[user] - 1 for user in before}
    assert all(g > -0.02 for g in gain.values()), gain
    assert gain["u1"] > 0.10 and gain["u4"] > 0.10, gain


events = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"), st.sampled_from(["a", "b", "c"]), st.sampled_from([1, 2, 4, 8, 12])
        ),
        st.tuples(st.just("finish"), st.integers(0, 40), st.just(0)),
        st.tuples(st.just("observe"), st.integers(0, 40), st.integers(1, 50)),
        st.tuples(st.just("plan"), st.integers(1, 3), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=40, deadline=None)
@given(events=events, trading=st.booleans())
def test_invariants_under_random_arrivals_and_departures(
    events: list[tuple[str, object, int]], trading: bool
) -> None:
    cluster = parse_cluster_spec("v100:1x8,p100:2x4,k80:2x8")
    config = SchedulerConfig(trading=trading)
    scheduler = MachineHarness(cluster, {"a": 2.0}, TABLE, config)
    twin = MachineHarness(cluster, {"a": 2.0}, TABLE, config)
    sizes: dict[str, int] = {}
    live: list[str] = []
    now = 0.0
    for kind, arg, value in events:
        now += 1
        if kind == "submit":
            job = JobSpec(f"j{len(sizes)}", str(arg), value, "Fast" if arg == "a" else None)
            sizes[job.id] = job.gpus
            assert scheduler.submit(job, now) == twin.submit(job, now)
            live.append(job.id)
        elif kind == "finish" and live:
            job_id = live.pop(int(str(arg)) % len(live))
            scheduler.finish(job_id, now)
            twin.finish(job_id, now)
        elif kind == "observe" and live:
            job_id = live[int(str(arg)) % len(live)]
            scheduler.observe(job_id, "k80", float(value), now)
            twin.observe(job_id, "k80", float(value), now)
        elif kind == "plan":
            for _ in range(int(str(arg))):
                plan = scheduler.plan(now)
                assert plan == twin.plan(now)  # deterministic
                _check(scheduler, plan, sizes)
                assert set(plan.placements) <= set(live)
                _assert_work_conserving(scheduler, plan, {j: sizes[j] for j in live})
                held = scheduler.entitlements()
                for generation, gpus in cluster.gpus_per_generation().items():
                    assert sum(h[generation] for h in held.values()) <= gpus + 1e-6


def _assert_work_conserving(scheduler: MachineHarness, plan: Plan, sizes: dict[str, int]) -> None:
    """No waiting job fits the GPUs the plan leaves idle on any one server (or on whole idle
    servers of one generation, for a gang larger than a server)."""
    cluster = scheduler.cluster
    free = {s.id: s.gpus for s in cluster.servers}
    for job, servers in plan.placements.items():
        for server_id in servers:
            free[server_id] -= cluster.server(server_id).gpus if len(servers) > 1 else sizes[job]
    for job, gpus in sizes.items():
        if job in plan.placements:
            continue
        for generation in cluster.generations:
            if not scheduler.fits(job, generation):
                continue
            members = cluster.by_generation(generation)
            assert all(free[s.id] < gpus for s in members), (job, free)
            idle = sum(s.gpus for s in members if free[s.id] == s.gpus)
            assert gpus <= max(s.gpus for s in members) or idle < gpus, (job, free)


def test_a_lone_job_uses_its_users_share_of_every_pool() -> None:
    # Two one-job users, no trading: each is entitled to half of each pool, and with jobs
    # free to move between generations, both get V100 time (the quanta alternate).
    cluster = parse_cluster_spec("v100:1x1,k80:1x1")
    scheduler = MachineHarness(cluster, {}, TABLE, SchedulerConfig(trading=False))
    scheduler.submit(JobSpec("a", "a", 1, "Fast"), 0)
    scheduler.submit(JobSpec("b", "b", 1, "Fast"), 0)
    scheduler.submit(JobSpec("c", "c", 1, "Fast"), 0)
    on_v100 = dict.fromkeys("abc", 0)
    for quantum in range(300):
        for job in scheduler.plan(quantum).runs.get("v100-0", ()):
            on_v100[job] += 1
    assert on_v100 == {user: pytest.approx(100, abs=3) for user in "abc"}


def test_idle_fast_gpus_take_the_jobs_that_gain_most_there() -> None:
    cluster = parse_cluster_spec("v100:1x2,k80:1x4")
    scheduler = MachineHarness(cluster, {}, TABLE, SchedulerConfig(trading=False))
    scheduler.submit(JobSpec("fast", "a", 1, "Fast"), 0)
    scheduler.submit(JobSpec("flat", "b", 1, "Flat"), 0)
    plan = scheduler.plan(0)
    assert plan.runs["v100-0"] == ("fast",)  # Flat runs slower on a V100 than on a K80
    assert plan.runs["k80-0"] == ("flat",)
    assert scheduler.settled(0)  # nothing waits: the plan holds until something changes
