"""One replay, end to end: pick the policy by name, run the simulator, build the report.

With a shares file (`ReplayOptions.shares`) the `gandiva-fair` policy and the ledger (the
report's yardstick) divide the GPUs down its accounts; the other policies know only its users'
tickets (flat, as the trace's), not its accounts.

With the `gandiva-fair` policy and trading on, the same replay also runs without trading to
compute the report's ``trading_gain``, unless the run made no trade at all (then both runs are
the same run and the gain is 0.0 without paying for a second one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from gfair.core.cluster import Cluster
from gfair.core.kernel import DEFAULT_QUANTUM_S
from gfair.core.scheduler import SchedulerConfig
from gfair.core.shares_tree import ShareTree
from gfair.core.switch_costs import SwitchCosts
from gfair.core.throughput import ThroughputTable
from gfair.journal import JournalFile
from gfair.sim.gandiva_fair_machine import GandivaFairMachine
from gfair.sim.ledger import ShareSeries
from gfair.sim.policies.fifo import Fifo
from gfair.sim.policies.max_min_fairness import MaxMinFairness
from gfair.sim.policies.paper_split_stride import NAME as PAPER_SPLIT_STRIDE
from gfair.sim.policies.paper_split_stride import PaperSplitStride
from gfair.sim.policies.static_partition import StaticPartition
from gfair.sim.policies.tiresias import Tiresias
from gfair.sim.policy import Policy
from gfair.sim.report import Report, build_report, total_throughput
from gfair.sim.simulator import SimConfig, SimResult, Simulator, TimelineSink
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import Trace

# The live service's state machine, driven with virtual time (`gfair.sim.gandiva_fair_machine`).
GANDIVA_FAIR: Final = "gandiva-fair"
MAX_MIN_FAIRNESS: Final = "max-min-fairness"
POLICY_NAMES: Final = (
    GANDIVA_FAIR,
    "fifo",
    "static-partition",
    "tiresias",
    MAX_MIN_FAIRNESS,
    PAPER_SPLIT_STRIDE,
)


@dataclass(frozen=True)
class ReplayOptions:
    policy: str = GANDIVA_FAIR
    quantum_s: float = DEFAULT_QUANTUM_S
    trading: bool = True
    tickets: Mapping[str, float] = field(default_factory=dict)  # override the trace's
    default_tickets: float = 1.0
    until_s: float | None = None
    costs: SwitchCosts = field(default_factory=SwitchCosts)
    seed: int = 0
    rate_noise: float = 0.0
    series_bucket_s: float | None = None
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    shares: ShareTree | None = None  # accounts above the trace's users (`--shares`)


@dataclass(frozen=True)
class Replay:
    result: SimResult
    report: Report

    @property
    def series(self) -> ShareSeries | None:
        return self.result.ledger.series


def share_tree(options: ReplayOptions) -> ShareTree | None:
    return options.shares if options.shares is not None else options.scheduler.shares


def user_tickets(trace: Trace, options: ReplayOptions) -> dict[str, float]:
    tickets = dict(trace.tickets)
    tickets.update(options.tickets)
    tree = share_tree(options)
    if tree is not None:  # a user the file names has the file's tickets
        tickets.update(tree.user_tickets)
    for user, value in tickets.items():
        if not value > 0:
            raise ValueError(f"user {user}: tickets must be > 0, got {value:g}")
    return tickets


def build_policy(
    name: str,
    cluster: Cluster,
    trace: Trace,
    speeds: SpeedModel,
    throughput: ThroughputTable,
    options: ReplayOptions,
    journal: JournalFile | None = None,
) -> Policy:
    tickets = user_tickets(trace, options)
    if name == GANDIVA_FAIR:
        config = replace(
            options.scheduler,
            trading=options.trading,
            quantum_s=options.quantum_s,
            shares=share_tree(options),
        )
        return GandivaFairMachine(
            cluster, tickets, throughput, config, options.default_tickets, options.costs, journal
        )
    if name == "fifo":
        return Fifo(cluster, speeds)
    if name == "static-partition":
        return StaticPartition(cluster, speeds, trace.users, tickets, options.default_tickets)
    if name == "tiresias":
        return Tiresias(cluster, speeds)
    if name == MAX_MIN_FAIRNESS:
        return MaxMinFairness(cluster, speeds, tickets, options.default_tickets)
    if name == PAPER_SPLIT_STRIDE:
        return PaperSplitStride(cluster, speeds, tickets, options.default_tickets)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")


def replay(
    trace: Trace,
    cluster: Cluster,
    throughput: ThroughputTable,
    options: ReplayOptions | None = None,
    *,
    timeline: TimelineSink | None = None,
    progress: Callable[[float, int], None] | None = None,
    journal: JournalFile | None = None,
) -> Replay:
    """`journal`: where the gandiva-fair machine's inputs and outputs go (`gfair.journal`)."""
    options = options or ReplayOptions()
    speeds = SpeedModel.from_rates(throughput)
    result = _run(trace, cluster, throughput, speeds, options, timeline, progress, journal)
    gain = 0.0
    if options.policy == GANDIVA_FAIR and options.trading and result.trades > 0:
        without = replace(options, trading=False, series_bucket_s=None)
        baseline = _run(trace, cluster, throughput, speeds, without, None, None)
        base = total_throughput(baseline)
        gain = total_throughput(result) / base - 1.0 if base > 0 else 0.0
    report = build_report(result, trace=trace.source, seed=options.seed, trading_gain=gain)
    return Replay(result=result, report=report)


def _run(
    trace: Trace,
    cluster: Cluster,
    throughput: ThroughputTable,
    speeds: SpeedModel,
    options: ReplayOptions,
    timeline: TimelineSink | None,
    progress: Callable[[float, int], None] | None,
    journal: JournalFile | None = None,
) -> SimResult:
    policy = build_policy(options.policy, cluster, trace, speeds, throughput, options, journal)
    config = SimConfig(
        quantum_s=options.quantum_s,
        costs=options.costs,
        until_s=options.until_s,
        tickets=user_tickets(trace, options),
        default_tickets=options.default_tickets,
        shares=share_tree(options),
        series_bucket_s=options.series_bucket_s,
        rate_noise=options.rate_noise,
        seed=options.seed,
    )
    simulator = Simulator(trace, cluster, policy, speeds, config, timeline, progress)
    return simulator.run()
