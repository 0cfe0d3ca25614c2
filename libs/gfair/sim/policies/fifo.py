"""FIFO: gang scheduling, no preemption, strictly first come, first served.

Jobs start in submission order, each on its fastest generation with room (best-fit server, or
whole idle servers for gangs larger than a server), and run to completion. The queue's head
blocks everyone behind it until it fits: there is no backfilling, so a big gang waiting for
whole servers holds back the small jobs after it (the head-of-line blocking Philly's analysis
attributes to gang scheduling). Jobs that cannot fit the empty cluster are rejected.
"""

from __future__ import annotations

from collections import deque

from gfair.core.cluster import Cluster
from gfair.sim.policies.occupancy import Occupancy, RunningJobs
from gfair.sim.policy import UNTIL_NEXT_EVENT, Admission, PolicyDecision
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import TraceJob


class Fifo:
    name = "fifo"

    def __init__(self, cluster: Cluster, speeds: SpeedModel) -> None:
        self._generations = cluster.generations
        self._speeds = speeds
        self._occupancy = Occupancy(cluster)
        self._running = RunningJobs()
        self._queue: deque[TraceJob] = deque()

    def submit(self, job: TraceJob, now: float) -> Admission:
        if all(self._occupancy.held(g, job.gpus) is None for g in self._generations):
            return Admission(False, f"{job.gpus} GPUs do not fit any generation of the cluster")
        self._queue.append(job)
        return Admission(True)

    def finish(self, job_id: str, now: float) -> None:
        self._occupancy.release(self._running.stop(job_id))

    def observe(self, job_id: str, generation: str, rate: float, now: float) -> None:
        """Speeds are known up front; measurements change nothing here."""

    def plan(self, now: float) -> PolicyDecision:
        while self._queue:
            head = self._queue[0]
            generations = self._speeds.ranked(head.job_type, self._generations)
            placement = self._occupancy.place(head.gpus, generations)
            if placement is None:
                break
            self._queue.popleft()
            self._running.start(head.id, placement)
        return PolicyDecision(runs=self._running.runs)

    def quiet_until(self, now: float) -> float:
        return UNTIL_NEXT_EVENT
