"""Chaos: a hundred jobs while every service and a node executor are SIGKILLed (issue 5).

A seeded workload of short synthetic jobs (1, 2 and 4 GPUs, four users, some failing by
themselves, some running out of memory) runs on a 4-server cluster. At seeded random moments
the test SIGKILLs each of the five scheduler services and two node executors; each comes back on
its own (restarted by the cluster) and rebuilds its state from the bus. At the end, from the
recorded events alone:

- every job ended exactly once: completed, or failed with its class and reason (the failing
  ones exactly as their injected fault says), none lost, none duplicated;
- placement's record of every job agrees with its terminal event;
- no two jobs ever held the same GPU at the same time, and no job ran on two servers at once.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from gfair.client import GfairClient
from gfair.client.job_history import (
    Job,
    Outcomes,
    gpu_overlaps,
    job_history,
    most_nodes_at_once,
    story,
)
from gfair.embedded_cluster import EmbeddedCluster
from gfair.events.jobs import JobCompleted, JobFailed, JobSuspended
from gfair.events.reasons import FailureClass, SuspendReason
from gfair.events.states import JobState

from .conftest import StartCluster, client_of, finished, patiently
from .workload import RESNET, synthetic

pytestmark = [pytest.mark.nats, pytest.mark.slow, pytest.mark.timeout(600)]

SEED = 20200427  # Gandiva_fair's EuroSys week
CLUSTER = "v100:2x4,k80:2x4"
QUANTUM_S = 2.0
USERS = {"alice": 2.0, "bob": 1.0, "carol": 1.0, "dave": 1.0}
JOBS = 104
FAILING = 6  # exit with an error of their own at step 2
OOM = 4  # die of CUDA out-of-memory at step 1
SUBMIT_OVER_S = 20.0
KILLS_BETWEEN_S = (3.0, 40.0)
EXECUTORS_KILLED = 2
CHAOS_ENV = {
    # A restarted executor is back within seconds: not long enough to be declared dead.
    "GFAIR_SUSPECT_AFTER_S": "5",
    "GFAIR_FAIL_AFTER_S": "12",
}


@dataclass(frozen=True, slots=True)
class PlannedJob:
    user: str
    job_id: str
    gpus: int
    command: list[str]
    fault: FailureClass | None


def plan_workload(rng: random.Random) -> list[PlannedJob]:
    faults: list[FailureClass | None] = [FailureClass.USER_ERROR] * FAILING
    faults += [FailureClass.OUT_OF_MEMORY] * OOM
    faults += [None] * (JOBS - len(faults))
    rng.shuffle(faults)
    jobs = []
    for index, fault in enumerate(faults):
        user = rng.choice(list(USERS))
        gpus = rng.choice((1, 1, 1, 1, 1, 1, 2, 2, 2, 4))
        seconds = rng.uniform(1.5, 4.0)
        if fault is FailureClass.USER_ERROR:
            command = synthetic(seconds, fail_at_step=2)
        elif fault is FailureClass.OUT_OF_MEMORY:
            command = synthetic(seconds, oom_at_step=1)
        else:
            command = synthetic(seconds)
        jobs.append(PlannedJob(user, f"chaos-{index:03d}", gpus, command, fault))
    return jobs


@dataclass
class Chaos:
    """Kills at seeded moments; how long each victim took to serve again."""

    cluster: EmbeddedCluster
    schedule: list[tuple[float, str]]
    recoveries_s: dict[str, float] = field(default_factory=dict)

    @classmethod
    def planned(cls, cluster: EmbeddedCluster, rng: random.Random) -> Chaos:
        victims = list(cluster.options.services)
        victims += rng.sample(list(cluster.node_ids), EXECUTORS_KILLED)
        moments = sorted(rng.uniform(*KILLS_BETWEEN_S) for _ in victims)
        rng.shuffle(victims)
        return cls(cluster, list(zip(moments, victims, strict=True)))

    async def run(self, began: float) -> None:
        waits = []
        for at, victim in self.schedule:
            await asyncio.sleep(max(0.0, began + at - time.monotonic()))
            killed_at = datetime.now(UTC)
            self.cluster.children.kill(victim)
            waits.append(asyncio.create_task(self._recovered(victim, killed_at)))
        await asyncio.gather(*waits)

    async def _recovered(self, victim: str, killed_at: datetime) -> None:
        self.recoveries_s[victim] = await self.cluster.wait_serving(
            victim, since=killed_at, timeout_s=90
        )


async def submit_all(client: GfairClient, jobs: list[PlannedJob], rng: random.Random) -> None:
    gap = SUBMIT_OVER_S / len(jobs)
    for job in jobs:
        await patiently(
            lambda job=job: client.submit(  # type: ignore[misc]
                job.user, job.gpus, job.command, job_type=RESNET, job_id=job.job_id, wait="none"
            )
        )
        await asyncio.sleep(rng.uniform(0, 2 * gap))


async def test_a_hundred_jobs_survive_every_service_and_a_node_being_killed(
    start_cluster: StartCluster,
) -> None:
    rng = random.Random(SEED)
    jobs = plan_workload(rng)
    async with (
        start_cluster(
            cluster=CLUSTER,
            quantum_s=QUANTUM_S,
            user_tickets=USERS,
            log_level="WARNING",
            env=CHAOS_ENV,
        ) as cluster,
        client_of(cluster) as client,
    ):
        chaos = Chaos.planned(cluster, rng)
        began = time.monotonic()
        await asyncio.gather(submit_all(client, jobs, rng), chaos.run(began))
        states = await asyncio.gather(*(finished(client, j.user, j.job_id, 300) for j in jobs))
        took_s = time.monotonic() - began
        history = await patiently(lambda: job_history(client.bus))
        records = {(r.user, r.job_id): r for r in await patiently(client.jobs)}
        restarts = {name: child.restarts for name, child in cluster.children.items()}
        alive = {name: child.alive for name, child in cluster.children.items()}

    expected: set[Job] = {(j.user, j.job_id) for j in jobs}
    outcomes = Outcomes.of(history)
    assert outcomes.problems(expected) == []
    assert all(outcomes.submitted[job] == 1 for job in expected)
    for job, state in zip(jobs, states, strict=True):
        end = outcomes.end((job.user, job.job_id))
        if job.fault is None:
            assert isinstance(end, JobCompleted), f"{job.job_id}: {end}"
        else:
            assert isinstance(end, JobFailed), f"{job.job_id} ({job.fault}): {end}"
            assert end.failure_class is job.fault and end.reason, end
        assert state is end.JOB_STATE
        record = records[(job.user, job.job_id)]
        assert record.state is end.JOB_STATE, f"{job.job_id}: record {record.state}, event {end}"
    overlaps, intervals = gpu_overlaps(history)
    # With the stories of the first two, for whoever reads a red run.
    shown = [(o.holder, o.intruder) for o in overlaps[:2]]
    assert overlaps == [], "\n".join(
        [repr(overlaps[:5])]
        + [line for pair in shown for job in pair for line in story(history, _job(job))]
    )
    # Every job fits one server here: holding GPUs on two at once would be running twice.
    twice = {job: n for job, n in most_nodes_at_once(history).items() if n > 1}
    assert twice == {}, "\n".join(line for job in twice for line in story(history, job))
    victims = [victim for _, victim in chaos.schedule]
    # The last kill came while jobs were still running.
    assert chaos.schedule[-1][0] < took_s
    assert all(restarts[v] >= 1 for v in victims), restarts
    assert all(alive.values()), alive
    assert set(chaos.recoveries_s) == set(victims)

    completed = sum(1 for s in states if s is JobState.COMPLETED)
    failed = sum(1 for s in states if s is JobState.FAILED)
    retries = sum(len(r) for r in outcomes.retries.values())
    # Jobs a killed executor's successor found running and stopped at their checkpoints.
    reaped = sum(
        1
        for e in history
        if isinstance(e.data, JobSuspended)
        and e.data.reason is SuspendReason.DRAIN
        and e.data.node_id in victims
    )
    slowest = max(chaos.recoveries_s.values())
    print(
        f"\nchaos (seed {SEED}): {len(jobs)} jobs ({completed} completed, {failed} failed with "
        f"their reason, 0 lost, 0 duplicated), {len(victims)} SIGKILLs "
        f"({', '.join(victims)}), {sum(restarts.values())} restarts, every one serving again "
        f"(slowest {slowest:.1f}s), {reaped} jobs stopped under killed executors and resumed, "
        f"{retries} retries, {intervals} GPU holdings replayed with "
        f"0 overlaps, {took_s:.0f}s from the first submission to the last job's end"
    )


def _job(name: str) -> Job:
    user, job_id = name.split("/", 1)
    return (user, job_id)
