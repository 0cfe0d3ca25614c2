"""The simulator's `gandiva-fair` policy (`gfair.sim.gandiva_fair_machine`: the split-stride state
machine, with placement, the trading auction, the profiler and the nodes played in-process),
stepped by a test: jobs in, one plan per call, and what a test checks a plan against (where each
job holds GPUs, which jobs moved, the users' entitlements).

What the machine starts between ticks (an arrival or an end filled idle GPUs) counts as held from
then on, as in the simulator; `fill` says which jobs those were.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gfair.core.cluster import Cluster
from gfair.core.scheduler import SchedulerConfig, SplitStride
from gfair.core.switch_costs import DEFAULT_COSTS, SwitchCosts
from gfair.core.throughput import ThroughputTable
from gfair.sim.gandiva_fair_machine import GandivaFairMachine
from gfair.sim.policy import UNTIL_NEXT_EVENT, Admission
from gfair.sim.trace import TraceJob


@dataclass(frozen=True)
class JobSpec:
    id: str
    user: str
    gpus: int
    job_type: str | None = None  # a key of the throughput table, or None (unknown type)
    array: str | None = None  # its job array's id (the user's), if it belongs to one
    array_limit: int | None = None
    costs: SwitchCosts | None = None  # what a resume and a move cost it; None: the run's

    def trace_job(self, now: float) -> TraceJob:
        return TraceJob(
            self.id,
            self.user,
            self.gpus,
            now,
            float("inf"),
            self.job_type,
            array=self.array,
            array_limit=self.array_limit,
            move_s=None if self.costs is None else self.costs.migration_s,
            resume_s=None if self.costs is None else self.costs.resume_s,
        )


@dataclass(frozen=True)
class Plan:
    runs: Mapping[str, tuple[str, ...]]  # server -> jobs holding GPUs there this quantum
    placements: Mapping[str, tuple[str, ...]]  # job -> the servers it holds GPUs on (sorted)
    # Jobs holding GPUs on other servers than they last held any (a move, or a resume elsewhere).
    moved: tuple[str, ...]
    trades: int  # trades that came into force with this plan


class MachineHarness:
    def __init__(
        self,
        cluster: Cluster,
        tickets: Mapping[str, float] | None = None,
        throughput: ThroughputTable | None = None,
        config: SchedulerConfig | None = None,
        costs: SwitchCosts = DEFAULT_COSTS,
    ) -> None:
        self.cluster = cluster
        self.policy = GandivaFairMachine(
            cluster, tickets or {}, throughput or {}, config or SchedulerConfig(), costs=costs
        )
        self._specs: dict[str, JobSpec] = {}
        self._held: dict[str, tuple[str, ...]] = {}  # job -> servers it holds GPUs on now
        self._last: dict[str, tuple[str, ...]] = {}  # job -> servers it last held GPUs on
        self._filled: dict[str, tuple[str, ...]] = {}  # started between ticks, not yet read

    @property
    def machine(self) -> SplitStride:
        return self.policy.machine

    def submit(self, spec: JobSpec, now: float = 0.0) -> Admission:
        admission = self.policy.submit(spec.trace_job(now), now)
        if admission.accepted:
            self._specs[spec.id] = spec
            self._take_fill(now)
        return admission

    def finish(self, job_id: str, now: float) -> None:
        self.policy.finish(job_id, now)
        del self._specs[job_id]
        self._held.pop(job_id, None)
        self._last.pop(job_id, None)
        self._filled.pop(job_id, None)
        self._take_fill(now)

    def observe(self, job_id: str, generation: str, rate: float, now: float) -> None:
        self.policy.observe(job_id, generation, rate, now)

    def plan(self, now: float) -> Plan:
        decision = self.policy.plan(now)
        held: dict[str, list[str]] = {}
        for server, jobs in decision.runs.items():
            for job in jobs:
                held.setdefault(job, []).append(server)
        placements = {job: tuple(sorted(servers)) for job, servers in held.items()}
        moved = tuple(
            job for job, servers in placements.items() if self._last.get(job, servers) != servers
        )
        self._filled.clear()
        self._held = dict(placements)
        self._last.update(placements)
        return Plan(dict(decision.runs), placements, moved, decision.trades)

    def fill(self) -> dict[str, tuple[str, ...]]:
        """The jobs started between ticks since the last plan or `fill`: job -> servers."""
        filled, self._filled = self._filled, {}
        return filled

    def settled(self, now: float) -> bool:
        """Whether the policy promised that the next quanta repeat the last until a job arrives,
        ends or is profiled."""
        return self.policy.quiet_until(now) == UNTIL_NEXT_EVENT

    def placement(self, job_id: str) -> tuple[str, ...]:
        """The servers the job holds GPUs on (after the last plan and the starts since; empty
        when it waits)."""
        return self._held.get(job_id, ())

    def entitlements(self) -> dict[str, dict[str, float]]:
        """User -> pool -> GPUs, of the users with jobs, as the last plan was decided from."""
        return {name: dict(user.entitled) for name, user in self.machine.users.items()}

    def fits(self, job_id: str, generation: str) -> bool:
        """Whether the job could ever run on `generation`: its type runs there and its gang is
        no larger than the pool."""
        spec = self._specs[job_id]
        pool = sum(s.gpus for s in self.cluster.by_generation(generation))
        return self.machine.estimator.fits(spec.job_type, generation) and spec.gpus <= pool

    def _take_fill(self, now: float) -> None:
        for job, servers in self.policy.fill(now).items():
            placed = tuple(sorted(servers))
            self._filled[job] = self._held[job] = self._last[job] = placed
