"""The `gandiva-fair` policy: the core's `GandivaFair` facade, driven with virtual time.

Nothing is decided here; this only translates between the simulator's and the core's types and
counts the trades that come into force.
"""

from __future__ import annotations

from collections.abc import Mapping

from gfair.core.cluster import Cluster
from gfair.core.scheduler import Admission, GandivaFair, JobSpec, SchedulerConfig
from gfair.core.switch_costs import DEFAULT_COSTS, SwitchCosts
from gfair.core.throughput import ThroughputTable
from gfair.core.trading import Trade
from gfair.sim.policy import EVERY_QUANTUM, UNTIL_NEXT_EVENT, Decision
from gfair.sim.trace import TraceJob


class GandivaFairPolicy:
    name = "gandiva-fair"
    limits_arrays = True  # the kernel's snapshot does (sim.policy.LimitingArrays)

    def __init__(
        self,
        cluster: Cluster,
        tickets: Mapping[str, float],
        throughput: ThroughputTable,
        config: SchedulerConfig | None = None,
        default_tickets: float = 1.0,
        costs: SwitchCosts = DEFAULT_COSTS,
    ) -> None:
        self._costs = costs  # each job's, unless its trace row gives its own
        self.scheduler = GandivaFair(
            cluster, tickets, throughput, config or SchedulerConfig(), default_tickets
        )
        self._trades: frozenset[Trade] = frozenset()

    def submit(self, job: TraceJob, now: float) -> Admission:
        spec = JobSpec(
            job.id,
            job.user,
            job.gpus,
            job.job_type,
            array=job.array,
            array_limit=job.array_limit,
            costs=job.costs(self._costs),
        )
        return self.scheduler.submit(spec, now)

    def finish(self, job_id: str, now: float) -> None:
        self.scheduler.finish(job_id, now)

    def observe(self, job_id: str, generation: str, rate: float, now: float) -> None:
        self.scheduler.observe(job_id, generation, rate, now)

    def plan(self, now: float) -> Decision:
        plan = self.scheduler.plan(now)
        # The plan lists the trades in force; count the ones that were not in force before.
        new = 0
        if plan.trades or self._trades:
            in_force = frozenset(plan.trades)
            new = len(in_force - self._trades)
            self._trades = in_force
        return Decision(runs=plan.runs, trades=new)

    def fill(self, now: float) -> dict[str, tuple[str, ...]]:
        return self.scheduler.backfill(now)

    def quiet_until(self, now: float) -> float:
        # When every runnable job ran, the next plan repeats this one until something changes.
        return UNTIL_NEXT_EVENT if self.scheduler.settled() else EVERY_QUANTUM
