"""Static partitioning: each user owns a fixed slice of every GPU generation, no borrowing.

Like Philly's virtual clusters: a user's slice of each generation is its ticket share (among all
users of the trace, fixed for the whole run) of that generation's GPUs, rounded by largest
remainder so the slices add up to the pool. The slice is a GPU count, not particular servers:
a job runs on any servers with room as long as its user's GPUs held on that generation stay
within the slice (a gang larger than a server holds whole servers, all counted). Each user's
jobs start in submission order (head-of-line within the user, as in `Fifo`), on the fastest
generation where both slice and servers have room, and run to completion. Idle slices stay
idle: that waste is what the baseline shows. A job no slice of its user can ever hold is
rejected.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping

from gfair.core.cluster import Cluster
from gfair.sim.policies.occupancy import Occupancy, RunningJobs
from gfair.sim.policy import UNTIL_NEXT_EVENT, Admission, PolicyDecision
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import TraceJob


def slices(capacity: int, tickets: Mapping[str, float]) -> dict[str, int]:
    """Split `capacity` GPUs in proportion to `tickets` by largest remainder (ties: by name)."""
    total = sum(tickets.values())
    exact = {user: capacity * n / total for user, n in tickets.items()}
    share = {user: math.floor(value) for user, value in exact.items()}
    left = capacity - sum(share.values())
    for user in sorted(exact, key=lambda u: (share[u] - exact[u], u))[:left]:
        share[user] += 1
    return share


class StaticPartition:
    name = "static-partition"

    def __init__(
        self,
        cluster: Cluster,
        speeds: SpeedModel,
        users: Iterable[str],
        tickets: Mapping[str, float],
        default_tickets: float = 1.0,
    ) -> None:
        weights = {user: tickets.get(user, default_tickets) for user in users}
        if not weights:
            raise ValueError("static partitioning needs the trace's users")
        self._generations = cluster.generations
        self._speeds = speeds
        per_pool = {g: slices(gpus, weights) for g, gpus in cluster.gpus_per_generation().items()}
        self.slice = {user: {g: per_pool[g][user] for g in per_pool} for user in weights}
        self._held = {user: dict.fromkeys(per_pool, 0) for user in weights}
        self._occupancy = Occupancy(cluster)
        self._running = RunningJobs()
        self._owner: dict[str, str] = {}
        self._queues: dict[str, deque[TraceJob]] = {user: deque() for user in weights}

    def submit(self, job: TraceJob, now: float) -> Admission:
        own = self.slice.get(job.user)
        if own is None:
            return Admission(False, f"user {job.user} has no partition")
        if not self._fitting(job, own, ignore_held=True):
            largest = max(own.values())
            return Admission(
                False, f"{job.gpus} GPUs exceed every slice of user {job.user} (largest {largest})"
            )
        self._queues[job.user].append(job)
        return Admission(True)

    def finish(self, job_id: str, now: float) -> None:
        placement = self._running.stop(job_id)
        self._occupancy.release(placement)
        self._held[self._owner.pop(job_id)][placement.generation] -= placement.held

    def observe(self, job_id: str, generation: str, rate: float, now: float) -> None:
        """Speeds are known up front; measurements change nothing here."""

    def plan(self, now: float) -> PolicyDecision:
        for user, queue in self._queues.items():
            while queue:
                head = queue[0]
                placement = self._occupancy.place(
                    head.gpus, self._fitting(head, self.slice[user], ignore_held=False)
                )
                if placement is None:
                    break
                queue.popleft()
                self._running.start(head.id, placement)
                self._owner[head.id] = user
                self._held[user][placement.generation] += placement.held
        return PolicyDecision(runs=self._running.runs)

    def quiet_until(self, now: float) -> float:
        return UNTIL_NEXT_EVENT

    def _fitting(self, job: TraceJob, own: Mapping[str, int], *, ignore_held: bool) -> list[str]:
        """Generations, fastest first, where the job's GPUs fit the user's slice."""
        held = self._held[job.user]
        fitting = []
        for generation in self._speeds.ranked(job.job_type, self._generations):
            need = self._occupancy.held(generation, job.gpus)
            used = 0 if ignore_held else held[generation]
            if need is not None and used + need <= own[generation]:
                fitting.append(generation)
        return fitting
