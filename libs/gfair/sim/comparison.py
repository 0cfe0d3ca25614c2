"""Policies x workloads in one run: the rows of `gfair compare` and `python -m bench.policies`.

`catalog` names the standard workloads (built lazily: the Philly ones need the trace);
`compare` replays every (workload, policy) pair, side by side in worker processes, and returns
one `Outcome` per pair with the metrics of the report (`gfair.sim.report`) and the completed
jobs' JCTs for the CDF plot. Results do not depend on the number of workers: every replay is
deterministic and independent.

The standard set (seeded; ``load`` is the offered load over cluster capacity, see
`gfair.sim.workloads.size_cluster`):

- ``philly-<vc>/<ratio>``: every Philly virtual cluster with at least 300 jobs (consecutive
  ones around its median submission, at most `philly_jobs` of them, `philly_work_gpu_h` V100
  GPU-hours of work (about the Gavel trace's) and `philly_days` days of submissions; 0 lifts a
  cap), jobs as users, on the 1:1:1
  V100:P100:K80 and the 12:128 V100:K80 ratio, sized for load 0.9;
- ``gavel/<ratio>``: a 500-job Gavel-style trace, every job its own user, at 3 jobs per hour,
  on 36 V100 + 36 P100 + 36 K80 and on the 12:128 ratio with the same load;
- ``users/<ratio>``: 500 Gavel-style jobs of six users with unequal tickets (4, 2, 2, 1, 1, 1)
  and unequal numbers of jobs, same rate and clusters;
- ``gavel/v100``: the homogeneous control, the same 500 jobs as ``gavel`` on 108 V100s.

``--quick`` replaces them with three small generated workloads (a few seconds in all);
`trace_workload` makes a user's own trace and cluster the one workload.
"""

from __future__ import annotations

import fnmatch
import math
import multiprocessing
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from gfair.core.cluster import parse_cluster_spec
from gfair.core.switch_costs import DEFAULT_COSTS, SwitchCosts
from gfair.sim.finish_time import GANG_AWARE, THEMIS, RhoSummary
from gfair.sim.replay import GANDIVA_FAIR, MAX_MIN_FAIRNESS, ReplayOptions, replay
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import Trace, read_trace
from gfair.sim.workloads import (
    RATIOS,
    JobTypes,
    User,
    Workload,
    fit_to,
    gavel_trace,
    homogeneous_spec,
    mean_speeds,
    middle,
    offered_load,
    philly_jobs,
    philly_virtual_clusters,
    size_cluster,
)

DEFAULT_POLICIES: Final = (GANDIVA_FAIR, MAX_MIN_FAIRNESS, "tiresias", "fifo")
QUANTUM_S: Final = 360.0
PHILLY_MIN_JOBS: Final = 300
PHILLY_LOAD: Final = 0.9
PHILLY_JOBS: Final = 1_000
PHILLY_WORK_GPU_H: Final = 20_000.0
PHILLY_DAYS: Final = 21.0
GAVEL_JOBS: Final = 500
GAVEL_JOBS_PER_HOUR: Final = 3.0
GAVEL_CLUSTER: Final = "v100:9x4,p100:9x4,k80:9x4"  # 36 + 36 + 36, as in Gavel's simulations
HOMOGENEOUS_GPUS: Final = 108
USERS: Final = (
    User("alice", 4.0, 3.0),
    User("bob", 2.0, 2.0),
    User("carol", 2.0, 1.0),
    User("dave", 1.0, 2.0),
    User("erin", 1.0, 1.0),
    User("frank", 1.0, 0.5),
)

# Rough relative cost per job of each policy, to start the longest replays first.
_COST: Final[Mapping[str, float]] = {GANDIVA_FAIR: 4.0, MAX_MIN_FAIRNESS: 2.0}


@dataclass(frozen=True)
class Outcome:
    """One replay's row of the table. Times in seconds; None where nothing completed."""

    workload: str
    cluster: str
    policy: str
    jobs: int
    completed: int
    avg_jct_s: float | None
    p50_jct_s: float | None
    p99_jct_s: float | None
    makespan_s: float
    busy_while_waiting: float | None
    idle_while_fitting: float | None
    jct_jain_index: float | None
    max_share_error: float | None
    trading_gain: float
    wall_s: float
    jcts_s: tuple[float, ...]
    moves_per_job: float | None = None  # starts on other servers than the job left
    moves_per_running_hour: float | None = None  # the same over the hours jobs held GPUs
    p95_jct_s: float | None = None
    avg_queueing_s: float | None = None
    finish_time_fairness: dict[str, RhoSummary] = field(default_factory=dict)
    # The completed jobs' rho per definition, for the plot; received and entitled shares per
    # user over time (`gfair.sim.report.SharesOverTime` as JSON).
    rhos: dict[str, tuple[float, ...]] = field(default_factory=dict)
    shares_over_time: dict[str, Any] | None = None

    def row(self) -> dict[str, Any]:
        """The flat row of the CSV: every scalar, each rho summary as `rho_<def>_<stat>`."""
        flat = {
            key: value
            for key, value in asdict(self).items()
            if key not in ("jcts_s", "rhos", "shares_over_time", "finish_time_fairness")
        }
        for definition in (THEMIS, GANG_AWARE):
            summary = self.finish_time_fairness.get(definition)
            for stat, value in (asdict(summary) if summary else {}).items():
                flat[f"rho_{definition}_{stat}"] = value
        return flat


@dataclass(frozen=True)
class Sources:
    """What the workloads are built from."""

    throughput: Mapping[str, Mapping[str, float]]
    throughput_path: Path | None
    philly_path: Path
    seed: int = 0
    philly_jobs: int = PHILLY_JOBS
    philly_work_gpu_h: float = PHILLY_WORK_GPU_H
    philly_days: float = PHILLY_DAYS


WorkloadBuilder = Callable[[], list[Workload]]


def catalog(sources: Sources, *, quick: bool = False) -> dict[str, WorkloadBuilder]:
    """Workload name pattern -> a builder of the workloads it stands for (see `select`)."""
    speeds = SpeedModel.from_rates(sources.throughput)
    types = JobTypes.from_table(speeds, sources.throughput_path)
    seed = sources.seed
    if quick:
        return {
            "quick-gavel/*": lambda: _gavel_family(
                "quick-gavel",
                gavel_trace(24, 6.0, types, seed),
                speeds,
                "v100:1x4,p100:1x4,k80:1x4",
            ),
            "quick-users/1:1:1": lambda: [
                _workload(
                    "quick-users/1:1:1",
                    "users",
                    gavel_trace(24, 6.0, types, seed, USERS[:3], name="quick-users"),
                    "v100:1x4,p100:1x4,k80:1x4",
                )
            ],
        }
    gavel = gavel_trace(GAVEL_JOBS, GAVEL_JOBS_PER_HOUR, types, seed)
    users = gavel_trace(GAVEL_JOBS, GAVEL_JOBS_PER_HOUR, types, seed, USERS, name="users")
    return {
        "philly-*": lambda: _philly_family(sources, speeds, types),
        "gavel/1:1:1": lambda: _gavel_family("gavel", gavel, speeds, GAVEL_CLUSTER)[:1],
        "gavel/12:128": lambda: _gavel_family("gavel", gavel, speeds, GAVEL_CLUSTER)[1:],
        "users/*": lambda: _gavel_family("users", users, speeds, GAVEL_CLUSTER, family="users"),
        "gavel/v100": lambda: [
            _workload(
                "gavel/v100",
                "homogeneous",
                gavel,
                homogeneous_spec(HOMOGENEOUS_GPUS),
            )
        ],
    }


def select(
    sources: Sources, patterns: Sequence[str] = (), *, quick: bool = False
) -> list[Workload]:
    """The workloads whose names match any of `patterns` (shell-style; all when empty).

    A family is only built when one of its names could match, so picking generated workloads
    never reads the Philly trace.
    """
    wanted = list(patterns) or ["*"]
    chosen: list[Workload] = []
    for family_pattern, build in catalog(sources, quick=quick).items():
        if not any(_may_match(family_pattern, pattern) for pattern in wanted):
            continue
        for workload in build():
            if any(fnmatch.fnmatchcase(workload.name, pattern) for pattern in wanted):
                chosen.append(workload)
    return chosen


def _may_match(family_pattern: str, pattern: str) -> bool:
    """Whether a name of the family could match `pattern` (conservative: wildcards say yes)."""
    prefix = family_pattern.split("*", 1)[0]
    literal = pattern.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0]
    return prefix.startswith(literal) or literal.startswith(prefix)


def _workload(
    name: str,
    family: str,
    trace: Trace,
    spec: str,
    note: str = "",
    speeds: SpeedModel | None = None,
) -> Workload:
    cluster = parse_cluster_spec(spec)
    fitted, dropped = fit_to(trace, cluster)
    parts = [f"{len(fitted.jobs)} jobs"]
    if dropped:
        parts.append(f"{dropped} larger than any pool left out")
    if speeds is not None:
        means = mean_speeds(fitted, speeds, cluster.generations)
        capacity = sum(n * means[g] for g, n in cluster.gpus_per_generation().items())
        parts.append(f"load {offered_load(fitted) / capacity:.2f}")
    if note:
        parts.append(note)
    return Workload(name, family, fitted, spec, ", ".join(parts))


def _gavel_family(
    prefix: str, trace: Trace, speeds: SpeedModel, base: str, family: str = "gavel"
) -> list[Workload]:
    """`trace` on the 1:1:1 cluster `base` and on the 12:128 ratio at the same load."""
    cluster = parse_cluster_spec(base)
    means = mean_speeds(trace, speeds, cluster.generations)
    capacity = sum(n * means[g] for g, n in cluster.gpus_per_generation().items())
    load = offered_load(trace) / capacity
    ratio = size_cluster(trace, speeds, RATIOS["12:128"], load)
    return [
        _workload(f"{prefix}/1:1:1", family, trace, base, speeds=speeds),
        _workload(f"{prefix}/12:128", family, trace, ratio, speeds=speeds),
    ]


def _philly_family(sources: Sources, speeds: SpeedModel, types: JobTypes) -> list[Workload]:
    philly = read_trace(sources.philly_path)
    workloads: list[Workload] = []
    for virtual_cluster in philly_virtual_clusters(philly, PHILLY_MIN_JOBS):
        trace = philly_jobs(philly, virtual_cluster, types, sources.seed)
        whole = len(trace.jobs)
        jobs_cap = sources.philly_jobs if sources.philly_jobs > 0 else whole
        work_cap = sources.philly_work_gpu_h if sources.philly_work_gpu_h > 0 else math.inf
        days_cap = sources.philly_days if sources.philly_days > 0 else math.inf
        trace = middle(trace, jobs_cap, work_cap, days_cap)
        note = "whole" if len(trace.jobs) == whole else f"middle {len(trace.jobs)} of {whole}"
        for ratio_name, ratio in RATIOS.items():
            spec = size_cluster(trace, speeds, ratio, PHILLY_LOAD)
            workloads.append(
                _workload(
                    f"philly-{virtual_cluster}/{ratio_name}",
                    "philly",
                    trace,
                    spec,
                    note,
                    speeds,
                )
            )
    return workloads


def trace_workload(
    trace: Trace, spec: str, speeds: SpeedModel, name: str | None = None
) -> Workload:
    """`trace` on the cluster `spec` as one workload (named after the trace's file), with the
    jobs no pool can hold left out so that every policy sees the same jobs."""
    label = name or Path(trace.source).name.split(".")[0] or "trace"
    return _workload(label, "trace", trace, spec, speeds=speeds)


def compare(
    workloads: Sequence[Workload],
    policies: Sequence[str],
    throughput: Mapping[str, Mapping[str, float]],
    *,
    quantum_s: float = QUANTUM_S,
    workers: int = 1,
    done: Callable[[Outcome], None] | None = None,
    costs: SwitchCosts = DEFAULT_COSTS,
) -> list[Outcome]:
    """Replay every (workload, policy) pair, every policy charged `costs` for each job's
    resumes and moves; outcomes in workload, then policy order."""
    tasks = [(workload, policy) for workload in workloads for policy in policies]
    table = {name: dict(rates) for name, rates in throughput.items()}
    results: dict[tuple[str, str], Outcome] = {}
    if workers <= 1:
        for workload, policy in tasks:
            outcome = run_one(workload, policy, table, quantum_s, costs)
            results[(workload.name, policy)] = outcome
            if done is not None:
                done(outcome)
    else:
        # Longest first, so the last replays to finish are short ones. "spawn": the workers
        # start clean, with no copy of the parent's threads or solver state.
        ordered = sorted(tasks, key=lambda task: -len(task[0].trace.jobs) * _COST.get(task[1], 0.3))
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = [
                pool.submit(run_one, workload, policy, table, quantum_s, costs)
                for workload, policy in ordered
            ]
            for future in futures:
                outcome = future.result()
                results[(outcome.workload, outcome.policy)] = outcome
                if done is not None:
                    done(outcome)
    return [results[(workload.name, policy)] for workload, policy in tasks]


def run_one(
    workload: Workload,
    policy: str,
    throughput: Mapping[str, Mapping[str, float]],
    quantum_s: float = QUANTUM_S,
    costs: SwitchCosts = DEFAULT_COSTS,
) -> Outcome:
    """One replay (gandiva-fair's includes the run without trading behind `trading_gain`)."""
    began = time.perf_counter()
    cluster = parse_cluster_spec(workload.cluster)
    options = ReplayOptions(
        policy=policy, quantum_s=quantum_s, costs=costs, series_bucket_s=quantum_s
    )
    report = replay(workload.trace, cluster, throughput, options).report
    wall = time.perf_counter() - began
    summary = report.summary
    jcts = tuple(job.jct_s for job in report.jobs if job.jct_s is not None)
    rhos = {
        THEMIS: tuple(job.rho_themis for job in report.jobs if job.rho_themis is not None),
        GANG_AWARE: tuple(
            job.rho_gang_aware for job in report.jobs if job.rho_gang_aware is not None
        ),
    }
    shares = report.shares_over_time
    return Outcome(
        workload=workload.name,
        cluster=workload.cluster,
        policy=policy,
        jobs=summary.jobs,
        completed=summary.completed,
        avg_jct_s=summary.avg_jct_s,
        p50_jct_s=summary.p50_jct_s,
        p99_jct_s=summary.p99_jct_s,
        makespan_s=summary.makespan_s,
        busy_while_waiting=summary.busy_while_waiting,
        idle_while_fitting=summary.idle_while_fitting,
        jct_jain_index=summary.jct_jain_index,
        max_share_error=summary.max_share_error,
        trading_gain=summary.trading_gain,
        wall_s=wall,
        jcts_s=jcts,
        moves_per_job=summary.moves_per_job,
        moves_per_running_hour=summary.moves_per_running_hour,
        p95_jct_s=summary.p95_jct_s,
        avg_queueing_s=summary.avg_queueing_s,
        finish_time_fairness=summary.finish_time_fairness,
        rhos=rhos,
        shares_over_time=asdict(shares) if shares is not None else None,
    )


def relative_jct(
    outcomes: Iterable[Outcome], reference: str = MAX_MIN_FAIRNESS
) -> dict[tuple[str, str], float]:
    """(workload, policy) -> average JCT over the `reference` policy's on the same workload."""
    outcomes = list(outcomes)
    base = {o.workload: o.avg_jct_s for o in outcomes if o.policy == reference and o.avg_jct_s}
    ratios: dict[tuple[str, str], float] = {}
    for outcome in outcomes:
        reference_jct = base.get(outcome.workload)
        if reference_jct and outcome.avg_jct_s is not None:
            ratios[(outcome.workload, outcome.policy)] = outcome.avg_jct_s / reference_jct
    return ratios


def hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.1f}"


def fraction(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"
