"""The kernel's shortcuts decide as its plain paths do: a long queue's jobs sorted by the pool
they live in, kept empty packings, and the state machine's queues kept in order as passes move."""

from __future__ import annotations

import dataclasses
import random

import pytest

from gfair.core.cluster import parse_cluster_spec
from gfair.core.kernel import (
    Decision,
    PoolState,
    RunnableJob,
    Snapshot,
    UserState,
    backfilling,
    cycle,
    decide,
    stride,
    surplus,
)
from gfair.core.packing import Packing
from gfair.core.scheduler import SchedulerConfig

from .machine_harness import JobSpec, MachineHarness

_GENERATIONS = ("v100", "p100", "k80")


def _random_snapshot(seed: int, *, types_per_user: int = 1) -> Snapshot:
    """Users with queues longer than the scan window, jobs that ran, left a checkpoint or never
    started, in every pool, some types fitting only some pools, gangs up to two servers."""
    rng = random.Random(seed)
    cluster = parse_cluster_spec("v100:3x4,p100:3x4,k80:6x4")
    pools = tuple(
        PoolState(g, cluster.by_generation(g), rank) for rank, g in enumerate(_GENERATIONS)
    )
    servers = [s.id for s in cluster.servers]
    users: dict[str, UserState] = {}
    jobs: dict[str, list[RunnableJob]] = {}
    seq = 0
    for n in range(rng.randint(2, 6)):
        name = f"u{n}"
        users[name] = UserState(
            name,
            seq,
            {g: rng.choice([0.0, 1.0, 2.5, 4.0]) for g in _GENERATIONS},
            {g: rng.uniform(-4.0, 8.0) for g in _GENERATIONS if rng.random() < 0.8},
        )
        seq += 1
        kinds = []
        for _ in range(types_per_user):
            speeds = {g: rng.choice([0.0, 0.3, 1.0, 2.5]) for g in _GENERATIONS}
            speeds[rng.choice(_GENERATIONS)] = 1.0  # it fits somewhere
            kinds.append(speeds)
        queue = []
        # Some queues come in long runs of jobs living in one pool, longer than the window a
        # visit looks through: the jobs after it must not be taken.
        blocky = rng.random() < 0.5
        block: list[str] = servers
        for index in range(rng.choice([1, 5, 20, 90, 150])):
            if index % 70 == 0:
                block = [s.id for s in rng.choice(pools).servers] if blocky else servers
            gpus = rng.choice([1, 1, 1, 2, 4, 8])
            where: tuple[str, ...] = ()
            if gpus <= 4 and rng.random() < (0.95 if blocky else 0.7):
                where = (rng.choice(block),)
            running, home = (where, where) if rng.random() < 0.5 else ((), where)
            queue.append(
                RunnableJob(
                    f"{name}-{seq}",
                    name,
                    gpus,
                    seq,
                    dict(rng.choice(kinds)),
                    pass_=0.0,
                    running=running,
                    home=home,
                    move_s=rng.choice([3.0, 60.0]),
                )
            )
            seq += 1
        jobs[name] = queue
    return Snapshot(pools, users, jobs, quantum_s=rng.choice([60.0, 360.0]))


def _fields(decision: Decision) -> tuple[object, ...]:
    return (
        list(decision.runs.items()),
        list(decision.placed.items()),
        decision.charged,
        decision.waiting,
        decision.idle,
        decision.served,
        decision.entitled,
    )


@pytest.mark.parametrize("seed", range(60))
def test_long_queues_decide_as_if_looked_through_job_by_job(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = _random_snapshot(seed)
    sorted_by_pool = decide(snapshot)
    monkeypatch.setattr(stride, "_SHORT_QUEUE", 10**9)  # every queue looked through in order
    assert _fields(decide(snapshot)) == _fields(sorted_by_pool)


@pytest.mark.parametrize("seed", range(10))
def test_kept_empty_packings_are_fresh_ones(seed: int) -> None:
    snapshot = _random_snapshot(seed)
    first = decide(snapshot)
    cycle._last.clear()
    for pool in snapshot.pools:
        pool._empty.clear()
    assert _fields(decide(snapshot)) == _fields(first)
    assert _fields(decide(snapshot)) == _fields(first)  # the kept ones were not written


def test_a_packing_copy_is_taken_from_independently() -> None:
    servers = parse_cluster_spec("v100:3x4").servers
    original = Packing(servers)
    original.place(3, ())
    twin = original.copy()
    assert twin.place(4, ()) == ("v100-1",)
    assert twin.place(1, ()) == ("v100-0",)  # best fit: the fullest server with room
    assert original.total == 9 and original.free == {"v100-0": 1, "v100-1": 4, "v100-2": 4}
    again = Packing(servers)
    again.place(3, ())
    assert [again.place(g, ()) for g in (4, 1, 2)] == [original.place(g, ()) for g in (4, 1, 2)]


def test_queues_stay_in_pass_order_whichever_way_they_are_updated() -> None:
    # "few" has a long queue of which a few run each quantum (its jobs taken out and put
    # back), "most" a short one that mostly runs, on a contended cluster: the machine's
    # snapshot (its queues, kept as passes move, `scheduler.queues`) lists every runnable
    # job of each user in (pass, arrival) order.
    scheduler = MachineHarness(parse_cluster_spec("v100:1x4,k80:1x4"), {}, {}, SchedulerConfig())
    for n in range(300):
        scheduler.submit(JobSpec(f"few-{n}", "few", 1 + n % 2), 0.0)
    for n in range(6):
        scheduler.submit(JobSpec(f"most-{n}", "most", 1), 0.0)
    ran: set[str] = set()
    for quantum in range(30):
        now = quantum * 60.0
        ran.update(scheduler.plan(now).placements)
        queues = scheduler.machine.snapshot(now).jobs
        assert {user: len(queue) for user, queue in queues.items()} == {"few": 300, "most": 6}
        for queue in queues.values():
            keys = [(job.pass_, job.seq) for job in queue]
            assert keys == sorted(keys)
    assert {f"most-{n}" for n in range(6)} <= ran and len(ran) > 20


@pytest.mark.parametrize("seed", range(120))
def test_no_job_is_placed_where_it_cannot_run(seed: int) -> None:
    # A user's jobs of one size and different types: rule 2's trading of places among them
    # once put a job in a pool where its speed is 0 (and rule 4 then divided by that speed).
    snapshot = _random_snapshot(seed, types_per_user=3)
    speeds = {job.id: job.speeds for queue in snapshot.jobs.values() for job in queue}
    generation = {s.id: p.generation for p in snapshot.pools for s in p.servers}
    decision = decide(snapshot)
    for key, servers in decision.placed.items():
        assert all(speeds[key].get(generation[s], 0.0) > 0 for s in servers), key


def _sharing_speeds(snapshot: Snapshot) -> Snapshot:
    """The same snapshot with the jobs of equal speeds holding one dict of them, as the
    scheduler's jobs of one type do."""
    shared: dict[tuple[tuple[str, float], ...], dict[str, float]] = {}
    jobs = {
        user: [
            dataclasses.replace(
                job, speeds=shared.setdefault(tuple(sorted(job.speeds.items())), job.speeds)
            )
            for job in queue
        ]
        for user, queue in snapshot.jobs.items()
    }
    return dataclasses.replace(snapshot, jobs=jobs)


@pytest.mark.parametrize("seed", range(40))
def test_jobs_sharing_their_speeds_decide_as_jobs_holding_their_own(seed: int) -> None:
    # Surplus sorts each speed profile's pools once, and rule 2 checks each profile once per
    # group: by the dict's identity, which jobs of one type share.
    snapshot = _random_snapshot(seed, types_per_user=3)
    assert _fields(decide(_sharing_speeds(snapshot))) == _fields(decide(snapshot))


@pytest.mark.parametrize("seed", range(60))
def test_surplus_looks_at_every_job_as_it_would_without_the_free_gpus_bound(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Surplus skips a job larger than every pool's free GPUs, and stops once none are free.
    snapshot = _random_snapshot(seed)
    bounded = decide(snapshot)
    monkeypatch.setattr(surplus, "TOTAL", lambda packing: 10**9)  # never bounded, never done
    assert _fields(decide(snapshot)) == _fields(bounded)


def test_a_gang_larger_than_a_server_takes_the_first_idle_servers_in_server_order() -> None:
    # On a pool of equal servers the idle ones are its fullest bucket's, in the order they
    # became idle there: the servers taken are still the first ones by the pool's order.
    packing = Packing(parse_cluster_spec("v100:4x4").servers)
    assert packing.place(1, ()) == ("v100-0",)
    packing.release(("v100-0",), 1)  # idle again, last in its bucket
    assert packing.fits(16) and not packing.fits(17)
    assert packing.place(8, ()) == ("v100-0", "v100-1")
    assert not packing.fits(9) and packing.fits(8)
    assert packing.place(12, ()) is None
    assert packing.place(8, ()) == ("v100-2", "v100-3")
    assert packing.total == 0


def _holding(seed: int, *, consistent: bool) -> tuple[list[PoolState], list[RunnableJob]]:
    """Running jobs on a cluster of two pools: one-server jobs in any order, gangs holding
    whole servers; unless `consistent`, some overbook a server or share a gang's."""
    rng = random.Random(seed)
    cluster = parse_cluster_spec("v100:6x4,k80:2x8,k80:3x4")
    pools = [PoolState(g, cluster.by_generation(g), rank) for rank, g in enumerate(("v100", "k80"))]
    size = {s.id: s.gpus for s in cluster.servers}
    free = dict(size)
    pool_of = {s.id: s.generation for s in cluster.servers}
    jobs: list[RunnableJob] = []
    for n in range(rng.randint(0, 40)):
        if rng.random() < 0.15:
            generation = rng.choice(("v100", "k80"))
            idle = [s for s, f in free.items() if pool_of[s] == generation and f == size[s]]
            if len(idle) < 2:
                continue
            servers = tuple(sorted(rng.sample(idle, 2)))
            gpus = rng.randint(
                sum(size[s] for s in servers) // 2 + 1, sum(size[s] for s in servers)
            )
        else:
            roomy = [s for s, f in free.items() if f > 0]
            if not roomy:
                break
            servers = (rng.choice(roomy),)
            gpus = rng.randint(1, free[servers[0]])
        if not consistent and rng.random() < 0.1:
            servers = (rng.choice(list(free)),)
            gpus = rng.randint(1, 4)
        for server in servers:
            free[server] = max(0, free[server] - (gpus if len(servers) == 1 else size[server]))
        jobs.append(RunnableJob(f"j{n}", "u", gpus, n, {"v100": 1.0, "k80": 1.0}, running=servers))
    if rng.random() < 0.3:
        jobs.append(RunnableJob("gone", "u", 1, 99, {"v100": 1.0}, running=("elsewhere",)))
    rng.shuffle(jobs)
    return pools, jobs


def _packings(packing: dict[str, Packing]) -> dict[str, tuple[object, ...]]:
    return {g: (p.free, p.total, [list(b) for b in p.buckets]) for g, p in packing.items()}


@pytest.mark.parametrize("seed", range(200))
def test_running_jobs_held_in_place_pack_as_placed_one_by_one(seed: int) -> None:
    # `backfill` marks the running jobs' GPUs taken without placing each: the free GPUs, and
    # the order of equally free servers best fit picks from, are those placing them gives.
    pools, jobs = _holding(seed, consistent=seed % 4 != 0)
    held = cycle.Cycle(Snapshot(pools, {}, {}), empty=False)
    in_order, chosen = backfilling._held_in_order(held, jobs)
    in_place = backfilling._held_in_place(held, jobs)
    if in_place is None:
        # Only when some job could not stay where it runs.
        assert seed % 4 == 0
        return
    packing, placed = in_place
    assert _packings(packing) == _packings(in_order)
    assert sorted(placed) == sorted(chosen)
    assert all(chosen[j].servers == chosen[j].job.running for j in chosen)
