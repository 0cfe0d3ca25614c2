"""The simulation report: a published JSON contract (`schemas/report.schema.json`).

Definitions (all times in virtual seconds, shares as fractions 0..1 of the cluster's GPUs):

- A user is *active* while it has admitted, unfinished jobs. ``entitled_share`` and
  ``received_share`` are time averages over the user's active time: its no-trading entitlement
  (tickets, water-filled by demand among the active users) and the GPUs its jobs held.
- ``effective_throughput``: V100-equivalent GPU-seconds of work done per second of the user's
  active time (a job on a K80 does about 0.3 V100-seconds of work per second per GPU).
- ``ideal_s``: the job's run time alone on the cluster's fastest generation for it;
  slowdown = ``jct_s / ideal_s``.
- ``jain_index``: Jain's fairness index over the users' received/entitled ratios (1 = every
  user got exactly its entitlement; users never active are left out).
- ``max_share_error``: the largest |received - entitled| over users, in share (0..1).
- With a shares file (`gfair.core.shares_tree`): each user's ``account`` (``""``: the root),
  and ``accounts``, each account's ``entitled_share`` and ``received_share`` over its active
  time (while a user below it is active): the GPUs of its subtree's water-fill, and those its
  users held. ``share_error_by_level``: level (1 for the root's children, top-level accounts
  and the users at the root, 2 below them, ...) -> the largest |received - entitled| over the
  accounts and users at that level. Both are empty without a shares file.
- ``utilization``: GPU-seconds held by jobs / (cluster GPUs x makespan).
- ``busy_while_waiting``: the same fraction, over only the time during which some job waits
  that the last decision left without GPUs (jobs that arrived since the last decision could
  not have started yet and do not count); None if no decision ever left a job waiting. A
  waiting gang may be too big for the GPUs left free, and a job's GPUs idle from its
  completion to the next decision, so 1.0 is not always reachable; a value well below it means
  GPUs idle while work queues.
- ``idle_while_fitting``: GPU-seconds idle that the jobs the last decision left waiting could
  have used (packed greedily onto the idle GPUs, `gfair.sim.idle_capacity`) / (cluster GPUs x
  the same waiting time); None when no decision left a job waiting. This is what a policy is
  answerable for: 0 is work-conserving, whatever gangs too big for the idle GPUs wait.
- ``jct_jain_index``: Jain's index over the completed jobs' ``ideal_s / jct_s`` (1 = every job
  slowed down by the same factor; lower = some jobs wait far longer relative to their size).
- ``migrations``: starts of a job on other servers than it left, in its pool or another (each
  charged the job's move cost); ``moves_per_job`` is that over the jobs, and
  ``moves_per_running_hour`` over the hours jobs held GPUs (summed over jobs, not GPUs); None
  when no job ran.
- ``trading_gain``: relative rise of the users' summed effective throughput against the same
  run without trading (0.0 for policies that do not trade, with ``--no-trading``, and when the
  run made no trade, which leaves it identical to the run without).
- ``avg_queueing_s``, ``p95_queueing_s``: the time from submission to first holding GPUs, over
  the jobs that started.
- ``finish_time_fairness``: per definition (``themis``, ``gang_aware``; `gfair.sim.finish_time`
  defines both and each job's ``present``, the jobs present over its life) the worst and mean
  rho, the fractions of completed jobs with rho > 1 and > 1.05, and Jain's index over rho. Each
  completed job carries its ``rho_themis`` and ``rho_gang_aware``.
- ``shares_over_time``: each user's received and entitled share of the cluster's GPUs per time
  bucket (at most `SHARE_BUCKETS` of them, of ``bucket_s`` seconds from ``start_s``); None when
  the replay kept no share series.
- ``timing.jobs_per_s``: jobs simulated per second of wall time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gfair.core.cluster import Cluster
from gfair.core.shares_tree import ROOT, depth_of
from gfair.sim.finish_time import (
    GANG_AWARE,
    THEMIS,
    RhoSummary,
    jobs_present,
    rho_gang_aware,
    rho_themis,
)
from gfair.sim.ledger import ShareSeries
from gfair.sim.simulator import SimResult

REPORT_VERSION = 1
# The report's share series is coarsened to at most this many buckets: a thousand users' series
# at the simulator's resolution would be megabytes of JSON.
SHARE_BUCKETS = 48


@dataclass(frozen=True)
class UserReport:
    tickets: float
    entitled_share: float
    received_share: float
    effective_throughput: float
    jobs: int
    rejected: int
    avg_jct_s: float | None
    account: str = ROOT


@dataclass(frozen=True)
class AccountReport:
    tickets: float
    level: int
    entitled_share: float
    received_share: float


@dataclass(frozen=True)
class JobReport:
    id: str
    user: str
    gpus: int
    submit_s: float
    start_s: float | None
    end_s: float | None
    jct_s: float | None
    ideal_s: float
    status: str
    reason: str
    present: float | None = None  # jobs present over its life (gfair.sim.finish_time)
    rho_themis: float | None = None
    rho_gang_aware: float | None = None


@dataclass(frozen=True)
class SharesOverTime:
    """Per user, received and entitled share of the cluster's GPUs in each time bucket."""

    start_s: float
    bucket_s: float
    received: dict[str, list[float]]
    entitled: dict[str, list[float]]


@dataclass(frozen=True)
class Summary:
    jobs: int
    completed: int
    rejected: int
    avg_jct_s: float | None
    p50_jct_s: float | None
    p95_jct_s: float | None
    p99_jct_s: float | None
    avg_slowdown: float | None
    makespan_s: float
    utilization: float
    busy_while_waiting: float | None
    idle_while_fitting: float | None
    jain_index: float | None
    jct_jain_index: float | None
    max_share_error: float | None
    suspends: int
    migrations: int
    moves_per_job: float | None
    moves_per_running_hour: float | None
    trades: int
    trading_gain: float
    avg_queueing_s: float | None
    p95_queueing_s: float | None
    finish_time_fairness: dict[str, RhoSummary]


@dataclass(frozen=True)
class Timing:
    wall_s: float
    sched_cpu_s: float
    quanta: int
    decisions: int
    jobs_per_s: float


@dataclass(frozen=True)
class Report:
    version: int
    policy: str
    cluster: dict[str, Any]
    quantum_s: float
    trace: str
    seed: int
    users: dict[str, UserReport]
    jobs: list[JobReport]
    summary: Summary
    timing: Timing
    accounts: dict[str, AccountReport]
    share_error_by_level: dict[str, float]
    shares_over_time: SharesOverTime | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def jain_index(values: Sequence[float]) -> float | None:
    if not values:
        return None
    squares = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * squares) if squares > 0 else 1.0


def rho_summary(rhos: Sequence[float]) -> RhoSummary:
    if not rhos:
        return RhoSummary(None, None, None, None, None)
    return RhoSummary(
        worst=max(rhos),
        mean=sum(rhos) / len(rhos),
        over_1=sum(rho > 1.0 for rho in rhos) / len(rhos),
        over_1_05=sum(rho > 1.05 for rho in rhos) / len(rhos),
        jain=jain_index(rhos),
    )


def shares_over_time(series: ShareSeries, buckets: int = SHARE_BUCKETS) -> SharesOverTime:
    """`series` summed `k` buckets at a time, `k` the least that leaves at most `buckets`."""
    times = series.times()
    step = max(1, -(-len(times) // buckets))

    def coarse(table: dict[str, list[float]], user: str) -> list[float]:
        fine = series.shares(user, table)
        return [sum(fine[i : i + step]) / step for i in range(0, len(fine), step)]

    return SharesOverTime(
        start_s=series.start,
        bucket_s=series.bucket_s * step,
        received={user: coarse(series.gpu_s, user) for user in series.users},
        entitled={user: coarse(series.entitled_gpu_s, user) for user in series.users},
    )


def cluster_spec(cluster: Cluster) -> str:
    """The spec string of `cluster` (consecutive servers of one generation and size grouped)."""
    groups: list[list[Any]] = []
    for server in cluster.servers:
        if groups and groups[-1][0] == server.generation and groups[-1][2] == server.gpus:
            groups[-1][1] += 1
        else:
            groups.append([server.generation, 1, server.gpus])
    return ",".join(f"{g}:{n}x{size}" for g, n, size in groups)


def total_throughput(result: SimResult) -> float:
    """Sum over users of their effective throughput (the base of `trading_gain`)."""
    return sum(
        account.work_gpu_s / account.active_s
        for account in result.ledger.accounts.values()
        if account.active_s > 0
    )


def build_report(
    result: SimResult,
    *,
    trace: str,
    seed: int = 0,
    trading_gain: float = 0.0,
) -> Report:
    capacity = result.cluster.total_gpus
    jct_by_user: dict[str, list[float]] = {}
    rejected_by_user: dict[str, int] = {}
    submitted_by_user: dict[str, int] = {}
    jobs: list[JobReport] = []
    jcts: list[float] = []
    slowdowns: list[float] = []
    rhos: dict[str, list[float]] = {THEMIS: [], GANG_AWARE: []}
    admitted = [job for job in result.jobs if job.status != "rejected"]
    lives = jobs_present(
        [
            (job.submit_s, max(job.submit_s, result.end_s if job.end_s is None else job.end_s))
            for job in admitted
        ]
    )
    present_of = {id(job): n for job, n in zip(admitted, lives, strict=True)}
    waits = [job.start_s - job.submit_s for job in result.jobs if job.start_s is not None]
    for job in result.jobs:
        submitted_by_user[job.user] = submitted_by_user.get(job.user, 0) + 1
        jct = job.end_s - job.submit_s if job.end_s is not None else None
        present = present_of.get(id(job))
        themis = gang = None
        if jct is not None and job.status == "completed":  # (not a job ended past its limit)
            jcts.append(jct)
            slowdowns.append(jct / job.ideal_s)
            jct_by_user.setdefault(job.user, []).append(jct)
            if present is not None:
                themis = rho_themis(jct, job.ideal_s, present)
                gang = rho_gang_aware(jct, job.ideal_s, present, job.gpus, capacity)
                rhos[THEMIS].append(themis)
                rhos[GANG_AWARE].append(gang)
        if job.status == "rejected":
            rejected_by_user[job.user] = rejected_by_user.get(job.user, 0) + 1
        jobs.append(
            JobReport(
                id=job.id,
                user=job.user,
                gpus=job.gpus,
                submit_s=job.submit_s,
                start_s=job.start_s,
                end_s=job.end_s,
                jct_s=jct,
                ideal_s=job.ideal_s,
                status=job.status,
                reason=job.reason,
                present=present,
                rho_themis=themis,
                rho_gang_aware=gang,
            )
        )
    tree = result.ledger.tree
    users: dict[str, UserReport] = {}
    ratios: list[float] = []
    errors: list[float] = []
    by_level: dict[str, float] = {}
    for name in sorted(result.ledger.accounts):
        account = result.ledger.accounts[name]
        active = account.active_s
        entitled = account.entitled_gpu_s / (capacity * active) if active > 0 else 0.0
        received = account.gpu_s / (capacity * active) if active > 0 else 0.0
        if active > 0 and entitled > 0:
            ratios.append(received / entitled)
            errors.append(abs(received - entitled))
            if tree is not None:
                level = str(depth_of(tree.account_of(name)) + 1)
                by_level[level] = max(by_level.get(level, 0.0), abs(received - entitled))
        user_jcts = jct_by_user.get(name, [])
        users[name] = UserReport(
            tickets=account.tickets,
            entitled_share=entitled,
            received_share=received,
            effective_throughput=account.work_gpu_s / active if active > 0 else 0.0,
            jobs=submitted_by_user.get(name, 0),
            rejected=rejected_by_user.get(name, 0),
            avg_jct_s=sum(user_jcts) / len(user_jcts) if user_jcts else None,
            account=tree.account_of(name) if tree is not None else ROOT,
        )
    accounts: dict[str, AccountReport] = {}
    for path in sorted(result.ledger.tree_accounts):
        totals = result.ledger.tree_accounts[path]
        active = totals.active_s
        report = AccountReport(
            tickets=totals.tickets,
            level=depth_of(path),
            entitled_share=totals.entitled_gpu_s / (capacity * active) if active > 0 else 0.0,
            received_share=totals.gpu_s / (capacity * active) if active > 0 else 0.0,
        )
        accounts[path] = report
        if active > 0 and report.entitled_share > 0:
            level = str(report.level)
            error = abs(report.received_share - report.entitled_share)
            by_level[level] = max(by_level.get(level, 0.0), error)
    makespan = result.end_s - result.start_s
    summary = Summary(
        jobs=len(result.jobs),
        completed=len(jcts),
        rejected=sum(rejected_by_user.values()),
        avg_jct_s=sum(jcts) / len(jcts) if jcts else None,
        p50_jct_s=percentile(jcts, 0.50),
        p95_jct_s=percentile(jcts, 0.95),
        p99_jct_s=percentile(jcts, 0.99),
        avg_slowdown=sum(slowdowns) / len(slowdowns) if slowdowns else None,
        makespan_s=makespan,
        utilization=result.ledger.busy_gpu_s / (capacity * makespan) if makespan > 0 else 0.0,
        busy_while_waiting=(
            result.busy_waiting_gpu_s / (capacity * result.waiting_s)
            if result.waiting_s > 0
            else None
        ),
        idle_while_fitting=(
            result.usable_idle_gpu_s / (capacity * result.waiting_s)
            if result.waiting_s > 0
            else None
        ),
        jain_index=jain_index(ratios),
        jct_jain_index=jain_index([1.0 / slowdown for slowdown in slowdowns]),
        max_share_error=max(errors) if errors else None,
        suspends=result.suspends,
        migrations=result.migrations,
        moves_per_job=result.migrations / len(result.jobs) if result.jobs else None,
        moves_per_running_hour=(
            result.migrations / (result.running_job_s / 3600) if result.running_job_s > 0 else None
        ),
        trades=result.trades,
        trading_gain=trading_gain,
        avg_queueing_s=sum(waits) / len(waits) if waits else None,
        p95_queueing_s=percentile(waits, 0.95),
        finish_time_fairness={name: rho_summary(values) for name, values in rhos.items()},
    )
    timing = Timing(
        wall_s=result.wall_s,
        sched_cpu_s=result.sched_cpu_s,
        quanta=result.quanta,
        decisions=result.plans,
        jobs_per_s=len(result.jobs) / result.wall_s if result.wall_s > 0 else 0.0,
    )
    return Report(
        version=REPORT_VERSION,
        policy=result.policy,
        cluster=_cluster_json(result.cluster),
        quantum_s=result.quantum_s,
        trace=trace,
        seed=seed,
        users=users,
        jobs=jobs,
        summary=summary,
        timing=timing,
        accounts=accounts,
        share_error_by_level=dict(sorted(by_level.items(), key=lambda item: int(item[0]))),
        shares_over_time=(
            shares_over_time(result.ledger.series) if result.ledger.series is not None else None
        ),
    )


def _cluster_json(cluster: Cluster) -> dict[str, Any]:
    per_generation: Mapping[str, int] = cluster.gpus_per_generation()
    return {
        "spec": cluster_spec(cluster),
        "servers": len(cluster.servers),
        "gpus": cluster.total_gpus,
        "generations": dict(per_generation),
    }
