"""Tiresias-style discretized two-dimensional LAS (Gu et al., NSDI 2019).

A job's priority is its attained service in GPU-seconds (GPUs x time run: the two dimensions),
discretized into queues: it starts in queue 0 and drops to queue k when its service passes
`thresholds_gpu_s[k-1]`. Queues are served in order, first come first served within a queue;
jobs are placed greedily in that order, and one that does not fit is skipped so smaller ones
behind it can use the room (work-conserving). Scheduling is preemptive: a running job that no
longer makes the cut is suspended, and a job that stays keeps its servers when they are still
free in the new plan (otherwise it moves, which the simulator charges as a migration).

Starvation guard (as in Tiresias): a job in a lower queue that has waited longer than
`promote_knob` times the time it has run is promoted back to queue 0, its service count for
queueing purposes restarting from zero.

Decisions change only at arrivals, completions, demotions and promotions; `quiet_until` tells
the simulator when the next demotion or promotion is due so it can skip the quanta in between.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from gfair.core.cluster import Cluster
from gfair.sim.policies.occupancy import Occupancy, Placement, RunningJobs
from gfair.sim.policy import UNTIL_NEXT_EVENT, Admission, Decision
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import TraceJob

# One GPU-hour and ten GPU-hours: most Philly jobs finish in queue 0, long gangs sink.
DEFAULT_THRESHOLDS_GPU_S: Final = (3_600.0, 36_000.0)
DEFAULT_PROMOTE_KNOB: Final = 8.0


@dataclass(frozen=True)
class TiresiasConfig:
    thresholds_gpu_s: tuple[float, ...] = DEFAULT_THRESHOLDS_GPU_S
    promote_knob: float | None = DEFAULT_PROMOTE_KNOB  # None: never promote

    def __post_init__(self) -> None:
        if list(self.thresholds_gpu_s) != sorted(set(self.thresholds_gpu_s)) or any(
            t <= 0 for t in self.thresholds_gpu_s
        ):
            raise ValueError("queue thresholds must be positive and strictly increasing")
        if self.promote_knob is not None and not self.promote_knob > 0:
            raise ValueError("promote_knob must be > 0")


class _Entry:
    __slots__ = ("attained", "executed_s", "queue", "seq", "spec", "waiting_since")

    def __init__(self, spec: TraceJob, seq: int, now: float) -> None:
        self.spec = spec
        self.seq = seq
        self.queue = 0
        self.attained = 0.0  # GPU-seconds counted towards demotion (reset on promotion)
        self.executed_s = 0.0  # wall seconds run, for the starvation guard
        self.waiting_since = now


class Tiresias:
    name = "tiresias"

    def __init__(
        self, cluster: Cluster, speeds: SpeedModel, config: TiresiasConfig | None = None
    ) -> None:
        self.config = config or TiresiasConfig()
        self._generations = cluster.generations
        self._cluster = cluster
        self._speeds = speeds
        self._occupancy = Occupancy(cluster)
        self._running = RunningJobs()
        self._entries: dict[str, _Entry] = {}
        self._waiting: dict[str, _Entry] = {}
        self._seq = 0
        self._accounted = -math.inf

    def submit(self, job: TraceJob, now: float) -> Admission:
        if all(self._occupancy.held(g, job.gpus) is None for g in self._generations):
            return Admission(False, f"{job.gpus} GPUs do not fit any generation of the cluster")
        entry = _Entry(job, self._seq, now)
        self._seq += 1
        self._entries[job.id] = entry
        self._waiting[job.id] = entry
        return Admission(True)

    def finish(self, job_id: str, now: float) -> None:
        del self._entries[job_id]
        self._occupancy.release(self._running.stop(job_id))

    def observe(self, job_id: str, generation: str, rate: float, now: float) -> None:
        """Tiresias is agnostic of speed; measurements change nothing here."""

    def plan(self, now: float) -> Decision:
        self._account(now)
        if self._waiting:
            running = set(self._running.placements)
            if not self._fill_free():
                self._replan(now, running)
        return Decision(runs=self._running.runs)

    def quiet_until(self, now: float) -> float:
        if not self._waiting:
            return UNTIL_NEXT_EVENT  # everybody runs: no demotion can change that
        thresholds = self.config.thresholds_gpu_s
        soonest = math.inf
        for job_id in self._running.placements:
            entry = self._entries[job_id]
            if entry.queue < len(thresholds):
                left = thresholds[entry.queue] - entry.attained
                soonest = min(soonest, now + max(left, 0.0) / entry.spec.gpus)
        knob = self.config.promote_knob
        if knob is not None:
            for entry in self._waiting.values():
                if entry.queue > 0:
                    soonest = min(soonest, entry.waiting_since + knob * entry.executed_s)
        return soonest

    def _account(self, now: float) -> None:
        """Charge running jobs their service since the last decision; demote and promote."""
        elapsed = max(0.0, now - self._accounted)
        self._accounted = now
        thresholds = self.config.thresholds_gpu_s
        if elapsed > 0:
            for job_id in self._running.placements:
                entry = self._entries[job_id]
                entry.attained += entry.spec.gpus * elapsed
                entry.executed_s += elapsed
                while entry.queue < len(thresholds) and entry.attained >= thresholds[entry.queue]:
                    entry.queue += 1
        knob = self.config.promote_knob
        if knob is not None:
            for entry in self._waiting.values():
                if entry.queue > 0 and now - entry.waiting_since >= knob * entry.executed_s:
                    entry.queue = 0
                    entry.attained = 0.0

    def _fill_free(self) -> bool:
        """Start waiting jobs in free GPUs; True when all of them fit (nothing to preempt)."""
        all_fit = True
        for entry in sorted(self._waiting.values(), key=_priority):
            placement = self._occupancy.place(entry.spec.gpus, self._ranked(entry))
            if placement is None:
                all_fit = False
                continue
            self._begin(entry, placement)
        return all_fit

    def _replan(self, now: float, running: set[str]) -> None:
        """Recompute the whole run set in priority order (jobs keep free servers).

        `running` holds the jobs that ran before this decision: those left out are preempted
        and start waiting now.
        """
        previous = dict(self._running.placements)
        for job_id in previous:
            self._running.stop(job_id)
        self._occupancy = Occupancy(self._cluster)
        chosen: dict[str, Placement] = {}
        for entry in sorted(self._entries.values(), key=_priority):
            if self._occupancy.free_total == 0:
                break
            placement = None
            old = previous.get(entry.spec.id)
            if old is not None:
                placement = self._occupancy.take(old.servers, entry.spec.gpus)
            if placement is None:
                placement = self._occupancy.place(entry.spec.gpus, self._ranked(entry))
            if placement is not None:
                chosen[entry.spec.id] = placement
        for job_id, placement in chosen.items():
            self._running.start(job_id, placement)
            self._waiting.pop(job_id, None)
        for job_id in previous.keys() - chosen.keys():
            entry = self._entries[job_id]
            if job_id in running:
                entry.waiting_since = now
            self._waiting[job_id] = entry

    def _begin(self, entry: _Entry, placement: Placement) -> None:
        self._running.start(entry.spec.id, placement)
        del self._waiting[entry.spec.id]

    def _ranked(self, entry: _Entry) -> tuple[str, ...]:
        return self._speeds.ranked(entry.spec.job_type, self._generations)


def _priority(entry: _Entry) -> tuple[int, int]:
    return (entry.queue, entry.seq)
