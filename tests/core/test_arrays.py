"""Job arrays' limits (`gfair.core.arrays`): never more than N of an array run in a quantum."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfair.core.arrays import ArrayMember, array_key, excess_demand, limit_arrays
from gfair.core.cluster import parse_cluster_spec
from gfair.core.kernel import RunnableJob
from gfair.core.scheduler import SchedulerConfig

from .machine_harness import JobSpec, MachineHarness


def _scheduler(spec: str) -> MachineHarness:
    return MachineHarness(parse_cluster_spec(spec), {}, {}, SchedulerConfig(trading=False))


def _running_per_array(
    scheduler: MachineHarness, now: float, arrays: dict[str, str]
) -> dict[str, int]:
    counts: dict[str, int] = {}
    for job_id in scheduler.plan(now).placements:
        if job_id in arrays:
            counts[arrays[job_id]] = counts.get(arrays[job_id], 0) + 1
    return counts


def test_an_array_runs_at_most_its_limit_on_an_idle_cluster_and_the_rest_goes_to_others() -> None:
    scheduler = _scheduler("v100:1x8")
    arrays = {}
    for index in range(6):
        job_id = f"sweep-{index}"
        arrays[job_id] = "sweep"
        spec = JobSpec(job_id, "alice", 1, array="sweep", array_limit=2)
        assert scheduler.submit(spec, 0).accepted
    for index in range(3):
        assert scheduler.submit(JobSpec(f"bob-{index}", "bob", 1), 0).accepted
    for quantum in range(6):
        plan = scheduler.plan(quantum)
        running = [j for j in plan.placements if j in arrays]
        assert len(running) == 2  # 8 GPUs would hold all six
        assert {f"bob-{i}" for i in range(3)} <= set(plan.placements)  # no GPU kept for alice
    # A running member keeps its slot: the array does not rotate through checkpoints.
    assert not scheduler.plan(7).moved


def test_the_smallest_limit_of_an_array_holds_and_arrays_of_two_users_are_apart() -> None:
    scheduler = _scheduler("v100:1x8")
    for index in range(4):
        # A member naming a larger limit (or none) cannot raise the array's.
        limit = None if index == 3 else (3 if index else 1)
        scheduler.submit(JobSpec(f"a-{index}", "alice", 1, array="x", array_limit=limit), 0)
        scheduler.submit(JobSpec(f"b-{index}", "bob", 1, array="x", array_limit=3), 0)
    placed = set(scheduler.plan(0).placements)
    assert len([j for j in placed if j.startswith("a-")]) == 1
    assert len([j for j in placed if j.startswith("b-")]) == 3


def test_a_finished_member_frees_its_slot_for_the_next() -> None:
    scheduler = _scheduler("v100:1x4")
    for index in range(3):
        scheduler.submit(JobSpec(f"s-{index}", "alice", 1, array="s", array_limit=1), 0)
    first = set(scheduler.plan(0).placements)
    assert len(first) == 1
    done = first.pop()
    scheduler.finish(done, 1)
    second = set(scheduler.plan(1).placements)
    assert len(second) == 1 and done not in second


def test_demand_beyond_the_limit_is_not_water_filled() -> None:
    # alice asks 6 GPUs through an array capped at 2 and bob 6: without the cap they would
    # split 8 GPUs 4:4; capped, alice can hold 2, so bob is entitled to the other 6.
    scheduler = _scheduler("v100:1x8")
    for index in range(6):
        scheduler.submit(JobSpec(f"s-{index}", "alice", 1, array="s", array_limit=2), 0)
        scheduler.submit(JobSpec(f"b-{index}", "bob", 1), 0)
    scheduler.plan(0)
    entitled = scheduler.entitlements()
    assert entitled["alice"]["v100"] == pytest.approx(2.0)
    assert entitled["bob"]["v100"] == pytest.approx(6.0)


def test_excess_demand_keeps_the_largest_gangs_of_the_limit() -> None:
    capped = ArrayMember("u/a", 2)
    free = ArrayMember("u/b", None)
    jobs = [(4, capped), (1, capped), (2, capped), (8, free), (3, None)]
    assert excess_demand(jobs) == 1  # the 4 and the 2 can run at once, the 1 never with them
    assert excess_demand([(8, free), (3, None)]) == 0


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit must be >= 1"):
        ArrayMember("u/a", 0)


_job = st.tuples(
    st.sampled_from(["alice", "bob"]),
    st.integers(1, 4),  # GPUs
    st.sampled_from([None, "a", "b"]),  # array id
    st.sampled_from([None, 1, 2, 3]),  # limit
    st.booleans(),  # ran last quantum
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_job, min_size=1, max_size=24))
def test_limit_arrays_never_leaves_more_than_the_limit_and_keeps_running_members_first(
    jobs: list[tuple[str, int, str | None, int | None, bool]],
) -> None:
    queues: dict[str, list[RunnableJob]] = {}
    members: dict[str, ArrayMember] = {}
    for seq, (user, gpus, array, limit, ran) in enumerate(jobs):
        job_id = f"j{seq}"
        running = ("s0",) if ran else ()
        queues.setdefault(user, []).append(
            RunnableJob(job_id, user, gpus, seq, {}, running=running)
        )
        if array is not None:
            members[job_id] = ArrayMember(array_key(user, array), limit)
    out = limit_arrays(queues, members)
    for user, queue in queues.items():
        kept = out[user]
        assert [j.id for j in kept] == [j.id for j in queue if j in kept]  # order kept
        by_array: dict[str, list[RunnableJob]] = {}
        for job in queue:
            if job.id in members:
                by_array.setdefault(members[job.id].array, []).append(job)
            else:
                assert job in kept  # jobs of no array are never touched
        for group in by_array.values():
            limits = [members[j.id].limit for j in group if members[j.id].limit is not None]
            chosen = [j for j in group if j in kept]
            if not limits:
                assert chosen == group
                continue
            cap = min(limits)  # type: ignore[type-var]
            assert len(chosen) == min(cap, len(group))
            ran = [j for j in group if j.running]
            assert sum(1 for j in chosen if j.running) == min(cap, len(ran))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=12),
    st.integers(1, 4),
)
def test_the_simulators_scheduler_never_runs_more_than_the_limit(
    jobs: list[tuple[int, int]], limit: int
) -> None:
    scheduler = _scheduler("v100:2x4,k80:1x4")
    arrays: dict[str, str] = {}
    for index, (gpus, user) in enumerate(jobs):
        job_id = f"j{index}"
        arrays[job_id] = f"u{user}"
        scheduler.submit(JobSpec(job_id, f"u{user}", gpus, array="x", array_limit=limit), 0)
        scheduler.submit(JobSpec(f"free{index}", f"u{user}", gpus), 0)
    for quantum in range(5):
        counts = _running_per_array(scheduler, quantum, arrays)
        assert all(n <= limit for n in counts.values()), counts
