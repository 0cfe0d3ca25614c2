"""The split-stride machine's indexes never go stale: along seeded random event sequences, after
every event and tick, its node indexes (`SplitStride.holders`, `free_indices`, `parked_on`,
`free_gpus`) answer what a pass over every job's residencies answers, and the snapshot built
from its kept queues (`queues`) is the one built afresh from every job."""

from __future__ import annotations

import copy
import random

import pytest

from gfair.core import accounts, arrays
from gfair.core.kernel import RunnableJob
from gfair.core.scheduler import (
    Admitted,
    Ended,
    Event,
    Exited,
    Migrated,
    Node,
    NodeHealth,
    Parked,
    Phase,
    Releases,
    Retried,
    SchedulerConfig,
    ServersChanged,
    SplitStride,
    Started,
    Suspended,
    SwitchesMeasured,
    TypeProfiled,
    Unstartable,
)
from gfair.core.scheduler.snapshot import job_state
from gfair.core.switch_costs import MeasuredSwitches
from gfair.core.throughput import ThroughputEstimator

QUANTUM_S = 60.0
NODES = tuple(
    Node(f"{pool}-{i}", pool, tuple(range(gpus)))
    for pool, count, gpus in (("v100", 3, 4), ("k80", 2, 2))
    for i in range(count)
)


def _brute_holders(m: SplitStride, node_id: str) -> dict[str, tuple[int, ...]]:
    return {
        job.key: stay.gpu_indices
        for job in m.jobs.values()
        if (stay := job.stays.get(node_id)) is not None and stay.holds_gpus
    }


def _brute_parked(m: SplitStride, node_id: str) -> dict[str, tuple[int, ...]]:
    return {
        job.key: job.parked[1]
        for job in m.jobs.values()
        if job.parked is not None and job.parked[0] == node_id and not job.stays
    }


def _rebuilt(m: SplitStride, now: float) -> tuple[dict[str, list[RunnableJob]], list[RunnableJob]]:
    """The snapshot's jobs from every job, in the machine's order (users by their earliest
    runnable job, each user's by pass, then arrival); and every runnable job's state."""
    pool_gpus = m.index.pools[1]
    queues: dict[str, list[RunnableJob]] = {}
    members: dict[str, arrays.ArrayMember] = {}
    for key, job in m.jobs.items():
        if not m.runnable(job, now):
            continue
        if job.member is not None:
            members[key] = job.member
        speeds = m.estimator.gang_speeds(key, job.user, job.job_type, job.gpus, pool_gpus)
        state = job_state(job, speeds, m.config.operator_costs)
        queues.setdefault(job.user, []).append(state)
    for queue in queues.values():
        queue.sort(key=lambda state: (state.pass_, state.seq))
    limited = arrays.limit_arrays(queues, members) if members else queues
    every = [state for queue in queues.values() for state in queue]
    return {user: list(queue) for user, queue in limited.items()}, every


def _check(m: SplitStride, now: float) -> None:
    expected, every = _rebuilt(m, now)
    view = m.snapshot(now)
    # What a fill between ticks asks of the kept queues: the jobs whose whole gang runs, and
    # the fewest GPUs a job that does not run asks.
    running = {state.id: state for state in m.index.queues.running()}
    assert running == {state.id: state for state in every if state.running}
    waiting = [s.gpus for s in every if not s.running]
    assert m.index.queues.least_waiting() == (min(waiting) if waiting else None)
    # Users the snapshot left as they were (nothing they are entitled from changed) are as
    # entitling them again makes them.
    accounts_kept = {name: (u.entitled, u.credit) for name, u in copy.deepcopy(m.users).items()}
    m.index.entitled_for = None
    m.snapshot(now)
    assert {name: (u.entitled, u.credit) for name, u in m.users.items()} == accounts_kept
    assert list(view.jobs) == list(expected)
    assert {user: list(queue) for user, queue in view.jobs.items()} == expected
    asked = accounts.demand((job.user, job.gpus, job.member) for job in m.jobs.values())
    assert list(m.index.demand().items()) == list(asked.items())
    largest = {
        user: accounts.ceiling(job.gpus for job in m.jobs.values() if job.user == user)
        for user in asked
    }
    assert m.index.ceilings() == largest
    held_total = 0
    for node in m.nodes.values():
        here = m.index.stays_on(node.node_id).items()
        holders = {key: stay.gpu_indices for key, stay in here if stay.holds_gpus}
        assert holders == _brute_holders(m, node.node_id), node.node_id
        held = {i for indices in holders.values() for i in indices}
        free = m.index.free_indices(node)
        assert free == [i for i in node.gpu_indices if i not in held]
        assert m.index.parked_on(node.node_id) == _brute_parked(m, node.node_id), node.node_id
        if node.schedulable:
            held_total += sum(len(indices) for indices in holders.values())
    schedulable = sum(node.gpus for node in m.index.schedulable)
    assert m.index.free_gpus() == schedulable - held_total
    # GPUs promised to held-back jobs, as a pass over every held-back job finds them.
    sizes = m.index.sizes
    for node in NODES:
        assert m.index.promised(node.node_id) == sum(
            m.jobs[key].gpus_on(node.node_id, sizes)
            for key in m.held_back
            if key in m.jobs and node.node_id in m.jobs[key].servers
        )


def _event(m: SplitStride, rng: random.Random, now: float, serial: int) -> Event | None:
    """One plausible next input: a node's report about a stay, an admission, an end, a retry,
    a server failing or coming back."""
    stays = [(job, stay) for job in m.jobs.values() for stay in job.stays.values()]
    roll = rng.random()
    if roll < 0.2 or not m.jobs:
        array = rng.random() < 0.3
        return Admitted(
            user=rng.choice("abc"),
            job_id=f"j{serial}",
            now=now,
            gpus=rng.choice((1, 1, 2, 4)),
            weight=rng.choice((1.0, 2.0)),
            job_type=rng.choice((None, "big")),
            array="x" if array else None,
            array_limit=rng.choice((None, 1, 2)) if array else None,
            prepare=rng.random() < 0.3,
        )
    job = rng.choice(list(m.jobs.values()))
    if roll < 0.28:
        return Ended(user=job.user, job_id=job.job_id, now=now, state="completed")
    if roll < 0.3:
        return TypeProfiled(job.user, job.job_type, {"v100": 1.0, "k80": rng.uniform(0.1, 1.0)})
    if roll < 0.32:
        measured = MeasuredSwitches(rng.uniform(1, 9), rng.uniform(1, 9), rng.uniform(1, 9))
        return SwitchesMeasured(job.user, job.job_id, serial, measured)
    if roll < 0.37:
        return Retried(
            user=job.user,
            job_id=job.job_id,
            now=now,
            attempt=job.attempt + 1,
            at=now,
            delay_s=rng.choice((0.0, 0.0, 10.0)),
        )
    if roll < 0.42:
        node = rng.choice(NODES)
        health = rng.choice((NodeHealth.READY, NodeHealth.FAILED, NodeHealth.SUSPECTED))
        nodes = tuple(
            Node(n.node_id, n.generation, n.gpu_indices, health if n == node else n.health)
            for n in m.nodes.values()
        )
        return ServersChanged(nodes)
    if roll < 0.47:
        node_id = job.servers[0] if job.servers else rng.choice(NODES).node_id
        return Parked(user=job.user, job_id=job.job_id, now=now, node_id=node_id, attempt=1)
    if roll < 0.49:
        # Its process ended wherever it was (its node's report may come with no stay left).
        node_id = rng.choice(NODES).node_id
        return Exited(
            user=job.user, job_id=job.job_id, now=now, node_id=node_id, attempt=job.attempt, at=now
        )
    if not stays:
        return None
    job, stay = rng.choice(stays)
    common = {"user": job.user, "job_id": job.job_id, "now": now, "node_id": stay.node_id}
    if roll < 0.52:
        return Unstartable(**common)
    if roll < 0.57:
        return Exited(**common, attempt=stay.attempt, at=now)
    if roll < 0.62:
        return Migrated(**common, at=now)
    if roll < 0.7:
        return Releases(
            tuple(
                Suspended(
                    user=j.user,
                    job_id=j.job_id,
                    now=now,
                    node_id=st.node_id,
                    attempt=st.attempt,
                    in_place=False,
                    at=now,
                )
                for j, st in rng.sample(stays, min(3, len(stays)))
            )
        )
    if stay.phase is Phase.STARTING:
        return Started(**common, attempt=stay.attempt, gpu_indices=stay.gpu_indices, at=now)
    in_place = rng.random() < 0.5
    # Forced off while it still came up: a prepared job is prepared again (`preparing`).
    starting = not in_place and rng.random() < 0.4
    return Suspended(**common, attempt=stay.attempt, in_place=in_place, at=now, starting=starting)


@pytest.mark.parametrize("at_once", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_node_indexes_answer_what_every_job_says(seed: int, at_once: bool) -> None:
    rng = random.Random(seed)
    m = SplitStride(
        SchedulerConfig(quantum_s=QUANTUM_S, moves_at_once=at_once), ThroughputEstimator()
    )
    m.apply(ServersChanged(NODES))
    now = 0.0
    for serial in range(400):
        now += rng.uniform(0.5, 5.0)
        if serial % 15 == 14:
            m.tick(now)
        else:
            event = _event(m, rng, now, serial)
            if event is not None:
                m.apply(event)
        _check(m, now)
        if serial % 50 == 49:
            # A machine restored from what a driver persists builds its indexes alike.
            saved = copy.deepcopy(m.saved())
            _check(SplitStride(m.config, ThroughputEstimator(), saved), now)


@pytest.mark.parametrize("at_once", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_the_jobs_an_input_changed_are_named_by_take_changed(seed: int, at_once: bool) -> None:
    # A driver saves only the jobs `take_changed` names: every job whose persisted state
    # (`Job.signature`) differs after an input or a tick, and every job admitted or ended,
    # must be among them, or the record would keep it as it was.
    rng = random.Random(seed)
    m = SplitStride(
        SchedulerConfig(quantum_s=QUANTUM_S, moves_at_once=at_once), ThroughputEstimator()
    )
    m.apply(ServersChanged(NODES))
    m.take_changed()
    before = {key: job.signature() for key, job in m.jobs.items()}
    now = 0.0
    named = 0
    for serial in range(400):
        now += rng.uniform(0.5, 5.0)
        if serial % 15 == 14:
            m.tick(now)
        else:
            event = _event(m, rng, now, serial)
            if event is not None:
                m.apply(event)
        after = {key: job.signature() for key, job in m.jobs.items()}
        differ = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        taken = m.take_changed()
        assert differ <= taken, (serial, sorted(differ - taken))
        named += len(taken)
        before = after
    # Not everything, every time: most inputs change a few jobs.
    assert named < 400 * max(len(m.jobs), 1)


def test_check_mode_names_a_change_the_index_was_not_told_of() -> None:
    # The core tests run every machine with `check=True`; a transition that changes a job
    # without telling the index must fail at the input that made it, naming what went stale.
    m = SplitStride(SchedulerConfig(quantum_s=QUANTUM_S), ThroughputEstimator(), check=True)
    m.apply(ServersChanged(NODES))
    for job_id in ("j1", "j2"):
        m.apply(Admitted(user="a", job_id=job_id, now=1.0, gpus=1, weight=1.0, job_type=None))
    m.tick(2.0)
    m.jobs["a.j2"].stride_pass += 5.0  # behind the machine's back: no `touch`
    with pytest.raises(AssertionError, match=r"kernel state of a\.j2: kept .* derived"):
        m.apply(Admitted(user="b", job_id="j3", now=3.0, gpus=1, weight=1.0, job_type=None))
