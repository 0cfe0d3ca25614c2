"""Workloads for comparing policies: traces with the cluster each one is replayed on.

Everything here is deterministic given its seed (`random.Random` with string seeds, which
Python hashes the same way in every process).

- **Philly virtual clusters** (`philly_workload`): one virtual cluster of the Philly trace,
  every job its own user (the trace has no user column below the virtual cluster), each job
  given a Gavel job type drawn with the seed: 1-GPU jobs from every type the speed table can
  run, gangs from the types Gavel measured distributed (more than one GPU), as Gavel's own
  generator does. Jobs larger than the cluster's largest generation pool are left out, so every
  policy sees the same admitted jobs.
- **Gavel-style traces** (`gavel_trace`): Poisson arrivals at a given rate; 1, 2, 4 or 8 GPUs
  with probabilities 0.7, 0.1, 0.15, 0.05; run times on a V100 of ``60 * 10**U(1.5, 3)``
  seconds with probability 0.8 and ``60 * 10**U(3, 4)`` otherwise (Gavel's
  ``scheduler/utils.py``: from 30 minutes to about 7 days); types drawn as above. Jobs are
  their own users unless `users` gives named users with tickets, who then submit the jobs in
  proportion to their `share`.
- **Clusters** (`size_cluster`): 4-GPU servers in a generation ratio (``1:1:1`` V100:P100:K80,
  or the Gandiva_fair paper's ``12:128`` V100:K80), scaled so that the trace's offered load
  (`offered_load`: V100 GPUs busy on average over its arrival span if nothing ever waited) is
  `load` times the cluster's capacity in V100-equivalents (each generation's GPUs weighted by
  the trace's work-weighted mean speed there). Whole servers only, at least one per
  generation, so small workloads on the 12:128 ratio get the ratio as closely as whole servers
  allow.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from gfair.core.cluster import Cluster
from gfair.data import PHILLY_TRACE
from gfair.gavel import load_scaled_throughputs
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import Trace, TraceJob

SERVER_GPUS: Final = 4

# Generation -> relative GPU count.
RATIOS: Final[Mapping[str, Mapping[str, int]]] = {
    "1:1:1": {"v100": 1, "p100": 1, "k80": 1},
    "12:128": {"v100": 12, "k80": 128},
}

# Gavel's generator (scheduler/utils.py: _generate_scale_factor, _generate_duration).
_GANG_SIZES: Final = ((0.7, 1), (0.8, 2), (0.95, 4), (1.0, 8))
_LONG_FRACTION: Final = 0.2
_SHORT_LOG10_MINUTES: Final = (1.5, 3.0)
_LONG_LOG10_MINUTES: Final = (3.0, 4.0)


def default_philly_trace_path() -> Path:
    """The Philly trace packaged with gfair (`gfair.data`), the default of `gfair simulate`."""
    return PHILLY_TRACE


@dataclass(frozen=True)
class JobTypes:
    """The Gavel job types a generator may draw: all that run, and those that run distributed."""

    single: tuple[str, ...]
    distributed: tuple[str, ...]

    @classmethod
    def from_table(cls, speeds: SpeedModel, path: Path | None = None) -> JobTypes:
        """Types the speed model can run; distributed ones are those the table (at `path`, or
        the default) measured on more than one GPU with a V100 rate."""
        runnable = sorted(speeds.job_types)
        scaled = load_scaled_throughputs(path)
        multi = {
            job_type
            for (job_type, gpus), rates in scaled.items()
            if gpus > 1 and rates.get("v100", 0.0) > 0
        }
        distributed = tuple(t for t in runnable if t in multi)
        if not runnable:
            raise ValueError("the throughput table has no job type with a V100 rate")
        return cls(single=tuple(runnable), distributed=distributed or tuple(runnable))

    def draw(self, gpus: int, rng: random.Random) -> str:
        return rng.choice(self.single if gpus == 1 else self.distributed)


@dataclass(frozen=True)
class Workload:
    """A trace and the cluster to replay it on. `cluster` is a spec string (picklable)."""

    name: str
    family: str  # "philly", "gavel", "users" or "homogeneous"
    trace: Trace
    cluster: str
    note: str = ""
    tickets: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class User:
    name: str
    tickets: float
    share: float  # relative number of jobs submitted


def philly_virtual_clusters(trace: Trace, min_jobs: int = 300) -> list[str]:
    """Virtual clusters with at least `min_jobs` jobs, most jobs first (ties by name)."""
    counts: dict[str, int] = {}
    for job in trace.jobs:
        counts[job.user] = counts.get(job.user, 0) + 1
    chosen = [(count, name) for name, count in counts.items() if count >= min_jobs]
    return [name for _, name in sorted(chosen, key=lambda item: (-item[0], item[1]))]


def philly_jobs(trace: Trace, virtual_cluster: str, types: JobTypes, seed: int) -> Trace:
    """One virtual cluster's jobs, each its own user with a drawn Gavel type, starting at 0."""
    rng = random.Random(f"philly:{virtual_cluster}:{seed}")
    jobs = [job for job in trace.jobs if job.user == virtual_cluster]
    if not jobs:
        raise ValueError(f"the trace has no virtual cluster {virtual_cluster!r}")
    start = jobs[0].submit_s
    typed = tuple(
        replace(
            job,
            user=f"j{job.id}",
            submit_s=job.submit_s - start,
            job_type=types.draw(job.gpus, rng),
        )
        for job in jobs
    )
    return Trace(jobs=typed, tickets={}, source=f"philly:{virtual_cluster}", format="philly")


def middle(trace: Trace, jobs: int, work_gpu_h: float = math.inf, days: float = math.inf) -> Trace:
    """Consecutive jobs around the trace's median submission, at most `jobs` of them, at most
    `work_gpu_h` V100 GPU-hours of work in all and submitted within at most `days`, starting
    at 0 (the trace itself when it is within all three). The middle, not the start: Philly's
    virtual clusters ramp up over their first weeks. The caps bound the replay's cost, which
    grows with servers x quanta: with the work at a given load, and with the time span."""
    budget = work_gpu_h * 3600.0
    span = days * 86_400.0
    total = sum(job.gpus * job.duration_s for job in trace.jobs)
    whole_span = trace.jobs[-1].submit_s - trace.jobs[0].submit_s if trace.jobs else 0.0
    if len(trace.jobs) <= jobs and total <= budget and whole_span <= span:
        return trace
    low = high = len(trace.jobs) // 2  # the window is [low, high)
    work = 0.0
    left_turn = False
    while high - low < jobs:
        candidates = (low - 1, high) if left_turn else (high, low - 1)
        left_turn = not left_turn
        grown = False
        for index in candidates:
            if 0 <= index < len(trace.jobs):
                job = trace.jobs[index]
                first = trace.jobs[min(low, index)].submit_s
                last = trace.jobs[max(high - 1, index)].submit_s
                too_much = work + job.gpus * job.duration_s > budget or last - first > span
                if too_much and high > low:
                    continue
                work += job.gpus * job.duration_s
                if index < low:
                    low = index
                else:
                    high = index + 1
                grown = True
                break
        if not grown:
            break
    kept = trace.jobs[low:high]
    start = kept[0].submit_s
    shifted = tuple(replace(job, submit_s=job.submit_s - start) for job in kept)
    return replace(trace, jobs=shifted)


def gavel_trace(
    jobs: int,
    jobs_per_hour: float,
    types: JobTypes,
    seed: int,
    users: Sequence[User] = (),
    name: str = "gavel",
) -> Trace:
    """A Gavel-style generated trace (module docstring)."""
    if jobs < 1 or not jobs_per_hour > 0:
        raise ValueError("a generated trace needs jobs >= 1 and a positive arrival rate")
    arrivals = random.Random(f"{name}:arrivals:{seed}")
    draws = random.Random(f"{name}:jobs:{seed}")
    owners = random.Random(f"{name}:users:{seed}")
    rate_per_s = jobs_per_hour / 3600.0
    total_share = sum(user.share for user in users)
    now = 0.0
    generated: list[TraceJob] = []
    for index in range(jobs):
        if index:
            now += arrivals.expovariate(rate_per_s)
        gpus = _gang_size(draws)
        duration = _run_time(draws)
        job_type = types.draw(gpus, draws)
        user = f"j{index}"
        if users:
            user = _pick_user(users, total_share, owners)
        generated.append(
            TraceJob(
                id=str(index),
                user=user,
                gpus=gpus,
                submit_s=round(now, 3),
                duration_s=round(duration, 3),
                job_type=job_type,
                line=index + 2,
            )
        )
    tickets = {user.name: user.tickets for user in users}
    return Trace(jobs=tuple(generated), tickets=tickets, source=name, format="gfair")


def _gang_size(rng: random.Random) -> int:
    draw = rng.uniform(0, 1)
    for bound, size in _GANG_SIZES:
        if draw < bound:
            return size
    return _GANG_SIZES[-1][1]


def _run_time(rng: random.Random) -> float:
    low, high = _LONG_LOG10_MINUTES if rng.random() < _LONG_FRACTION else _SHORT_LOG10_MINUTES
    return 60.0 * 10 ** rng.uniform(low, high)


def _pick_user(users: Sequence[User], total: float, rng: random.Random) -> str:
    draw = rng.uniform(0, total)
    for user in users:
        draw -= user.share
        if draw < 0:
            return user.name
    return users[-1].name


def offered_load(trace: Trace) -> float:
    """V100 GPUs busy on average over the trace's arrival span if every job ran on V100s the
    moment it arrived (work past the last arrival not counted: a few long jobs must not make a
    short window look busy)."""
    if len(trace.jobs) < 2:
        return 0.0
    start, end = trace.jobs[0].submit_s, trace.jobs[-1].submit_s
    if not end > start:
        return 0.0
    busy = sum(
        job.gpus * (min(job.submit_s + job.duration_s, end) - job.submit_s) for job in trace.jobs
    )
    return busy / (end - start)


def mean_speeds(trace: Trace, speeds: SpeedModel, generations: Iterable[str]) -> dict[str, float]:
    """Each generation's work-weighted mean speed over the trace's jobs (V100 = 1)."""
    means: dict[str, float] = {}
    total = sum(job.gpus * job.duration_s for job in trace.jobs)
    for generation in generations:
        weighted = sum(
            job.gpus * job.duration_s * speeds.speed(job.job_type, generation) for job in trace.jobs
        )
        means[generation] = weighted / total if total > 0 else 1.0
    return means


def size_cluster(trace: Trace, speeds: SpeedModel, ratio: Mapping[str, int], load: float) -> str:
    """The cluster spec, in `ratio`, whose capacity makes the trace's offered load `load`."""
    if not load > 0:
        raise ValueError(f"load must be > 0, got {load}")
    means = mean_speeds(trace, speeds, ratio)
    per_unit = sum(count * means[generation] for generation, count in ratio.items())
    units = offered_load(trace) / load / per_unit  # GPUs per ratio unit
    servers = {
        generation: max(1, round(units * count / SERVER_GPUS))
        for generation, count in ratio.items()
    }
    return spec_of(servers)


def spec_of(servers: Mapping[str, int]) -> str:
    return ",".join(f"{generation}:{count}x{SERVER_GPUS}" for generation, count in servers.items())


def largest_pool(cluster: Cluster) -> int:
    return max(cluster.gpus_per_generation().values(), default=0)


def fit_to(trace: Trace, cluster: Cluster) -> tuple[Trace, int]:
    """The trace without jobs larger than the cluster's largest pool, and how many were left
    out."""
    limit = largest_pool(cluster)
    kept = tuple(job for job in trace.jobs if job.gpus <= limit)
    dropped = len(trace.jobs) - len(kept)
    if not dropped:
        return trace, 0
    return replace(trace, jobs=kept), dropped


def homogeneous_spec(gpus: int, generation: str = "v100") -> str:
    return spec_of({generation: math.ceil(gpus / SERVER_GPUS)})
