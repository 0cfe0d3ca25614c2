"""Tiresias-style discretized two-dimensional LAS (Gu et al., NSDI 2019).

A job's priority is its attained service in GPU-seconds (GPUs x time run: the two dimensions),
discretized into queues: it starts in queue 0 and drops to queue k when its service passes
`thresholds_gpu_s[k-1]`. Queues are served in order, first come first served within a queue;
jobs are placed greedily in that order, and one that does not fit is skipped so smaller ones
behind it can use the room (work-conserving). Scheduling is preemptive: a waiting job takes
free GPUs or evicts running jobs of lower priority, lowest first; running jobs are never moved,
and a preempted job resumes where it ran if that is free, anywhere else otherwise (which the
simulator charges as a migration).

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
from gfair.sim.policies.occupancy import Holding, Occupancy, RunningJobs
from gfair.sim.policy import UNTIL_NEXT_EVENT, Admission, PolicyDecision
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
    __slots__ = ("attained", "executed_s", "last", "queue", "seq", "spec", "waiting_since")

    def __init__(self, spec: TraceJob, seq: int, now: float) -> None:
        self.spec = spec
        self.seq = seq
        self.queue = 0
        self.attained = 0.0  # GPU-seconds counted towards demotion (reset on promotion)
        self.executed_s = 0.0  # wall seconds run, for the starvation guard
        self.waiting_since = now
        self.last: Holding | None = None  # where it ran before it was preempted


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

    def plan(self, now: float) -> PolicyDecision:
        self._account(now)
        if self._waiting:
            running = set(self._running.placements)
            if not self._fill_free():
                self._replan(now, running)
        return PolicyDecision(runs=self._running.runs)

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
        # Whether a gang fits only gets harder with its size, so once `gpus` did not fit, no
        # bigger job will either: skipping them keeps a long queue cheap.
        smallest_misfit = math.inf
        for entry in sorted(self._waiting.values(), key=_priority):
            if entry.spec.gpus >= smallest_misfit:
                continue
            placement = self._place(entry)
            if placement is None:
                smallest_misfit = entry.spec.gpus
                continue
            self._begin(entry, placement)
        return math.isinf(smallest_misfit)

    def _replan(self, now: float, running: set[str]) -> None:
        """Preempt in priority order; `running` holds the jobs that ran before this decision.

        Running jobs keep their places. Visiting the others in priority order, each takes free
        room, or else releases running jobs of lower priority, lowest first, until it fits.
        Released jobs whose places it did not need get them back; the others are suspended (and
        if it cannot fit at all, everyone gets their place back). Nothing is ever moved.
        """
        ordered = sorted(self._entries.values(), key=_priority)
        holding = set(self._running.placements)  # `running` and those `_fill_free` started
        victims = [entry for entry in ordered if entry.spec.id in holding]
        visited = 0  # victims[:visited] have higher priority than the job being placed
        evicted: set[str] = set()
        # As in `_fill_free`; later jobs also have fewer victims, so a misfit stays one.
        smallest_misfit = math.inf
        for entry in ordered:
            job_id = entry.spec.id
            if job_id in holding:
                visited += 1
                continue
            if self._occupancy.free_total == 0 and visited == len(victims):
                break
            if entry.spec.gpus >= smallest_misfit:
                continue
            placement = self._place(entry)
            freed: list[_Entry] = []
            index = len(victims) - 1
            while placement is None and index >= visited:
                victim = victims[index]
                index -= 1
                if victim.spec.id in evicted:
                    continue
                freed.append(victim)
                self._occupancy.release(self._running.placements[victim.spec.id])
                placement = self._place(entry)
            if placement is None:
                smallest_misfit = entry.spec.gpus
            else:
                self._begin(entry, placement)
            for victim in reversed(freed):  # highest priority first
                old = self._running.placements[victim.spec.id]
                if self._occupancy.take(old.servers, victim.spec.gpus) is None:
                    victim.last = self._running.stop(victim.spec.id)
                    if victim.spec.id in running:
                        victim.waiting_since = now
                    self._waiting[victim.spec.id] = victim
                    evicted.add(victim.spec.id)

    def _begin(self, entry: _Entry, placement: Holding) -> None:
        self._running.start(entry.spec.id, placement)
        del self._waiting[entry.spec.id]

    def _place(self, entry: _Entry) -> Holding | None:
        """Where it ran last if that is free (a resume in place costs less than a move)."""
        if entry.last is not None:
            placement = self._occupancy.take(entry.last.servers, entry.spec.gpus)
            if placement is not None:
                return placement
        generations = self._speeds.ranked(entry.spec.job_type, self._generations)
        return self._occupancy.place(entry.spec.gpus, generations)


def _priority(entry: _Entry) -> tuple[int, int]:
    return (entry.queue, entry.seq)
