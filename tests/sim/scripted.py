"""Hand-driven policies for testing the simulator's mechanics in isolation."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gfair.sim.policy import EVERY_QUANTUM, Admission, Policy, PolicyDecision
from gfair.sim.trace import TraceJob

Runs = Mapping[str, tuple[str, ...]]


class Scripted:
    """Runs whatever `script(now, active job ids)` returns; records every call."""

    name = "scripted"

    def __init__(self, script: Callable[[float, list[str]], Runs]) -> None:
        self.script = script
        self.active: list[str] = []
        self.finished: list[tuple[str, float]] = []
        self.observed: list[tuple[str, str, float, float]] = []
        self.plans: list[float] = []

    def submit(self, job: TraceJob, now: float) -> Admission:
        self.active.append(job.id)
        return Admission(True)

    def finish(self, job_id: str, now: float) -> None:
        self.active.remove(job_id)
        self.finished.append((job_id, now))

    def observe(self, job_id: str, generation: str, rate: float, now: float) -> None:
        self.observed.append((job_id, generation, rate, now))

    def plan(self, now: float) -> PolicyDecision:
        self.plans.append(now)
        return PolicyDecision(runs=self.script(now, list(self.active)))

    def quiet_until(self, now: float) -> float:
        return EVERY_QUANTUM


class RoundRobin(Scripted):
    """One job at a time on `server`, rotating every quantum (a one-GPU time-slicer)."""

    def __init__(self, server: str) -> None:
        self._turn = 0
        super().__init__(self._next)
        self.server = server

    def _next(self, now: float, active: list[str]) -> Runs:
        if not active:
            return {}
        job = active[self._turn % len(active)]
        self._turn += 1
        return {self.server: (job,)}


class EveryQuantum:
    """Wraps a policy and withholds its `quiet_until`, forcing a decision every quantum."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name

    def submit(self, job: TraceJob, now: float) -> Admission:
        return self.inner.submit(job, now)

    def finish(self, job_id: str, now: float) -> None:
        self.inner.finish(job_id, now)

    def observe(self, job_id: str, generation: str, rate: float, now: float) -> None:
        self.inner.observe(job_id, generation, rate, now)

    def plan(self, now: float) -> PolicyDecision:
        return self.inner.plan(now)

    def quiet_until(self, now: float) -> float:
        return EVERY_QUANTUM
