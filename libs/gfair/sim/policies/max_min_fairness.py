"""Heterogeneity-aware max-min fairness (Gavel: Narayanan et al., OSDI 2020), as a baseline.

The anchor gandiva-fair is measured against: what a scheduler that knows every job's speed on
every generation and re-optimises the whole cluster gets, in the same simulator, on the same
traces and costs.

**The allocation** (a linear program, solved with HiGHS whenever the set of active jobs
changed, at most once per round). For active jobs j and GPU generations g:

- ``X[j][g]`` in [0, 1]: the fraction of time j should run on g; ``X[j][g] = 0`` where j's type
  does not fit g, or its gang is larger than g's pool.
- ``s[j][g]``: j's speed on g (V100-seconds of work per second, the simulator's `SpeedModel`).
  Like Gavel, which assumes an oracle throughput table, the policy is given the true speeds:
  it never profiles, so `observe` changes nothing.
- ``w[j]``: the job's weight, its user's tickets split equally among the user's active jobs,
  scaled so the weights average 1.
- ``E[j] = sum_g s[j][g] * N[g] / (n * gpus[j])``: j's throughput under an equal share, where
  every one of the n jobs holds ``N[g] / n`` GPUs of every generation g (Gavel's "proportional"
  normalisation; the ``gpus[j]`` makes a gang of k GPUs entitled to the same GPU time as k
  1-GPU jobs, as Gavel's scale factors do).
- normalised throughput ``r[j] = sum_g X[j][g] * s[j][g] / (w[j] * E[j])``: 1 when j gets
  exactly its weighted equal share's throughput.

Stage 1: maximise t subject to ``r[j] >= t`` for every j, ``sum_g X[j][g] <= 1`` for every j,
and ``sum_j X[j][g] * held[j][g] <= N[g]`` for every g, where ``held`` is the GPUs j's gang
occupies on g (its request on one server; whole servers when larger than a server), X >= 0.

Stage 2 (`MaxMinConfig.pareto`, on by default; one more simplex run from stage 1's basis):
keep ``t >= t* (1 - 1e-6)`` and maximise the total unweighted normalised throughput
``sum_j sum_g X[j][g] * s[j][g] / E[j]``, so GPUs that stage 1 leaves unallocated (any optimum
of a max-min program is only pinned down for its bottleneck jobs) go to the jobs with the
largest speed-up there relative to their own average. This is a single water-filling step, not
Gavel's full iterated water-filling.

Identical jobs (same type, gang size and weight) have identical rows, and the program is convex,
so some optimum gives them identical X: the program is solved over job classes with
multiplicities, which keeps it at most (types x gang sizes x weights) rows whatever the queue
length.

**The rounds** (Gavel's round-based mechanism; a round is one simulator quantum). Since the
last allocation change, job j has run on g in ``received[j][g]`` of ``elapsed`` rounds; its
priority there is ``X[j][g] / (received[j][g] / elapsed)`` (``X * 1e9`` before it has run, so
newcomers go first in proportion to their allocation). Ties go to the larger deficit, the time
owed from earlier allocations (``X * elapsed - received``, carried over each change), then to
the larger X, then to the earlier submission. All (job, generation) pairs form one queue in that
order (Gavel's global-queue option: with one queue per generation, filled fastest first, a job
split between a fast and a slow generation keeps being taken by the fast one and the slow
generation's share of it goes to jobs with no allocation there; the global queue realises X to
within a few rounds). Pairs are taken while GPUs remain, skipping jobs already chosen and pairs
too big for what is left of their generation. Jobs with X = 0 on a generation still fill GPUs
nobody with a positive allocation wants (work conservation). The chosen jobs are then placed
per generation, largest gangs first: on their previous servers when those are free (no
migration), else on the best-fitting server, whole idle servers for gangs larger than a server;
a gang that fragmentation leaves without room yields its place to the next jobs that fit.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import highspy
import numpy as np
from highspy._core import _Highs
from numpy.typing import NDArray

from gfair.core.cluster import Cluster, generation_rank
from gfair.sim.policies.occupancy import Holding, Occupancy
from gfair.sim.policy import EVERY_QUANTUM, UNTIL_NEXT_EVENT, Admission, PolicyDecision
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import TraceJob

__all__ = ["MaxMinConfig", "MaxMinFairness", "MaxMinSolution", "max_min_allocation"]

FloatArray = NDArray[np.float64]

# Stage 2 keeps stage 1's optimum up to this relative slack, so solver tolerances never make it
# infeasible.
_KEEP_T: Final = 1.0 - 1e-6
# Gavel's priority for a job that has not run yet on a generation since the last change.
_UNSERVED: Final = 1e9
# A job whose whole allocation is the generation it runs on (X = 1 within solver tolerance).
_WHOLE: Final = 1.0 - 1e-6


@dataclass(frozen=True)
class MaxMinConfig:
    pareto: bool = True  # stage 2: spend what stage 1 leaves unallocated


@dataclass(frozen=True)
class MaxMinSolution:
    """A solved program: `x[k][g]` per class and generation, `t` the max-min value."""

    x: FloatArray
    t: float


def max_min_allocation(
    speed: FloatArray,
    held: FloatArray,
    gpus: FloatArray,
    weight: FloatArray,
    count: FloatArray,
    capacity: FloatArray,
    *,
    pareto: bool = True,
    solver: _Highs | None = None,
) -> MaxMinSolution:
    """Solve the program of the module docstring over job classes.

    `speed` and `held` are (classes x generations): speed of one job of the class and the GPUs
    its gang holds there, 0 in either where it does not fit. `gpus` (its request), `weight`
    (per job, any scale) and `count` (jobs in the class) are per class; `capacity` is GPUs per
    generation. `x` comes back 0 where the class does not fit.
    """
    classes, generations = speed.shape
    if classes == 0:
        return MaxMinSolution(np.zeros((0, generations)), 0.0)
    jobs = float(count.sum())
    weight = weight * jobs / float((weight * count).sum())  # mean 1 over jobs
    fits = (speed > 0) & (held > 0) & (held <= capacity[np.newaxis, :])
    masked = np.where(fits, speed, 0.0)
    equal = (masked @ capacity) / (jobs * gpus)
    # Classes that fit nowhere have no variable and are left out of the minimum.
    present = equal > 0
    coefficient = np.zeros_like(speed)
    coefficient[present] = masked[present] / (weight[present] * equal[present])[:, np.newaxis]
    rows_k, cols_g = np.nonzero(fits & present[:, np.newaxis])  # row-major: by class, then g
    variables = len(rows_k)
    if variables == 0:
        return MaxMinSolution(np.zeros_like(speed), 0.0)
    # Rows: [0, K) r[k] - t >= 0; [K, 2K) time fractions <= 1; [2K, 2K + G) pool capacities.
    # Columns: one per fitting (class, generation), then t. Column-wise sparse matrix.
    index = np.empty((variables, 3), dtype=np.int32)
    index[:, 0] = rows_k
    index[:, 1] = classes + rows_k
    index[:, 2] = 2 * classes + cols_g
    value = np.empty((variables, 3))
    value[:, 0] = coefficient[rows_k, cols_g]
    value[:, 1] = 1.0
    value[:, 2] = count[rows_k] * held[rows_k, cols_g]
    bottleneck = np.flatnonzero(present).astype(np.int32)
    a_index = np.concatenate([index.ravel(), bottleneck])
    a_value = np.concatenate([value.ravel(), np.full(len(bottleneck), -1.0)])
    a_start = np.concatenate([np.arange(0, 3 * variables + 1, 3), [len(a_index)]]).astype(np.int32)
    columns = variables + 1
    rows = 2 * classes + generations
    row_lower = np.concatenate(
        [np.zeros(classes), np.full(classes + generations, -highspy.kHighsInf)]
    )
    # Absent classes get no constraint on t at all (their row is empty: 0 >= 0 holds).
    row_upper = np.concatenate([np.full(classes, highspy.kHighsInf), np.ones(classes), capacity])
    cost = np.zeros(columns)
    cost[-1] = 1.0
    lower = np.zeros(columns)
    upper = np.concatenate([np.ones(variables), [highspy.kHighsInf]])
    highs = solver if solver is not None else new_solver()
    status = highs.passModel(
        columns,
        rows,
        len(a_index),
        int(highspy.MatrixFormat.kColwise),
        int(highspy.ObjSense.kMaximize),
        0.0,
        cost,
        lower,
        upper,
        row_lower,
        row_upper,
        a_start,
        a_index,
        a_value,
        # All continuous (kContinuous is 0). HiGHS reads one entry per column from this array
        # even for a pure LP, so it must not be left empty.
        np.zeros(columns, dtype=np.int32),
    )
    if status != highspy.HighsStatus.kOk:
        raise RuntimeError(f"max-min allocation: HiGHS refused the model ({status.name})")
    if not _solved(highs):
        # x = 0, t = 0 is always feasible and sum_g X <= 1 bounds t: this is a solver failure.
        raise RuntimeError(f"max-min allocation: HiGHS ended with {highs.getModelStatus().name}")
    values = np.asarray(highs.getSolution().col_value)
    t = float(values[-1])
    if pareto:
        efficiency = value[:, 0] * weight[rows_k]  # s / E: the coefficient without the weight
        costs = np.concatenate([count[rows_k] * efficiency, [0.0]])
        highs.changeColsCost(columns, np.arange(columns, dtype=np.int32), costs)
        highs.changeColBounds(variables, t * _KEEP_T, highspy.kHighsInf)
        if _solved(highs):
            values = np.asarray(highs.getSolution().col_value)
        # Else stage 1's optimum stands: it is feasible, only not Pareto-efficient.
    x = np.zeros_like(speed)
    x[rows_k, cols_g] = np.clip(values[:variables], 0.0, 1.0)
    return MaxMinSolution(x, t)


def new_solver() -> _Highs:
    """A silent, single-threaded HiGHS instance.

    The plain solver class, not `highspy.Highs`: that wrapper's callback set-up prints HiGHS's
    banner to stdout before any option can silence it, which would land in every report.
    """
    highs = _Highs()
    highs.setOptionValue("output_flag", False)
    # The simulator is single-threaded and the benchmarks run replays side by side.
    highs.setOptionValue("threads", 1)
    return highs


def _solved(highs: _Highs) -> bool:
    """Run; once more from scratch if that did not end optimal.

    Re-solving from the previous basis after the objective changed occasionally ends in
    "unknown" (seen on a 9-class program that a cold start solves at once)."""
    highs.run()
    if highs.getModelStatus() == highspy.HighsModelStatus.kOptimal:
        return True
    highs.clearSolver()
    highs.run()
    return bool(highs.getModelStatus() == highspy.HighsModelStatus.kOptimal)


class _MaxMinJob:
    __slots__ = ("cls", "held", "last", "row", "seq", "spec", "speed")

    def __init__(self, spec: TraceJob, seq: int, speed: list[float], held: list[int]) -> None:
        self.spec = spec
        self.seq = seq
        self.speed = speed  # per generation (fastest first); 0.0 where it does not fit
        self.held = held  # GPUs held per generation; 0 where it does not fit
        self.row = -1  # row in the round arrays, -1 until the first allocation
        self.cls = -1
        self.last: Holding | None = None  # where it ran most recently


class MaxMinFairness:
    name = "max-min-fairness"

    def __init__(
        self,
        cluster: Cluster,
        speeds: SpeedModel,
        tickets: Mapping[str, float],
        default_tickets: float = 1.0,
        config: MaxMinConfig | None = None,
    ) -> None:
        self.config = config or MaxMinConfig()
        self._cluster = cluster
        self._speeds = speeds
        self._tickets = dict(tickets)
        self._default_tickets = default_tickets
        # Fastest first: Gavel fills its worker types in that order.
        self._generations = tuple(sorted(cluster.generations, key=generation_rank, reverse=True))
        pools = cluster.gpus_per_generation()
        self._capacity = np.array([float(pools[g]) for g in self._generations])
        self._servers = [cluster.by_generation(g) for g in self._generations]
        self._probe = Occupancy(cluster)  # for gang sizes only; never reserved
        self._entries: dict[str, _MaxMinJob] = {}
        self._user_jobs: dict[str, int] = {}
        self._seq = 0
        self._changed = False
        # Round state, one row per active job as of the last allocation.
        self._rows: list[_MaxMinJob] = []
        self._x = np.zeros((0, len(self._generations)))
        self._received = np.zeros((0, len(self._generations)))
        self._deficit = np.zeros((0, len(self._generations)))
        self._fits = np.zeros((0, len(self._generations)), dtype=bool)
        self._elapsed = 0
        self._order: list[int] = []  # this round's queue (see `_queue`)
        self._settled = False
        self._solver = new_solver()
        # What the bench and tests read: how often and how long the program ran, its last value.
        self.solves = 0
        self.solve_s = 0.0
        self.t = 0.0

    # Policy protocol ----------------------------------------------------------------------

    def submit(self, job: TraceJob, now: float) -> Admission:
        speed: list[float] = []
        held: list[int] = []
        measured = self._speeds.by_type.get(job.job_type) if job.job_type is not None else None
        for generation in self._generations:
            need = self._probe.held(generation, job.gpus)
            if need is None or (measured is not None and generation not in measured):
                speed.append(0.0)
                held.append(0)
            else:
                speed.append(self._speeds.speed(job.job_type, generation))
                held.append(need)
        if not any(held):
            return Admission(False, f"{job.gpus} GPUs do not fit any generation of the cluster")
        self._entries[job.id] = _MaxMinJob(job, self._seq, speed, held)
        self._seq += 1
        self._user_jobs[job.user] = self._user_jobs.get(job.user, 0) + 1
        self._changed = True
        return Admission(True)

    def finish(self, job_id: str, now: float) -> None:
        entry = self._entries.pop(job_id)
        user = entry.spec.user
        self._user_jobs[user] -= 1
        if not self._user_jobs[user]:
            del self._user_jobs[user]
        self._changed = True

    def observe(self, job_id: str, generation: str, rate: float, now: float) -> None:
        """Speeds are known up front (Gavel's oracle throughputs); measurements change nothing."""

    def plan(self, now: float) -> PolicyDecision:
        if self._changed:
            self._allocate()
        if not self._rows:
            self._settled = True
            return PolicyDecision(runs={})
        chosen = self._choose()
        placed = self._place(chosen)
        runs: dict[str, tuple[str, ...]] = {}
        for row, (column, placement) in placed.items():
            entry = self._rows[row]
            entry.last = placement
            self._received[row, column] += 1.0
            for server in placement.servers:
                runs[server] = (*runs.get(server, ()), entry.spec.id)
        self._elapsed += 1
        # Everyone runs where all its time is allocated: every later round, until a job arrives
        # or finishes, takes the same pairs first and keeps them on the same servers.
        self._settled = len(placed) == len(self._rows) and all(
            self._x[row, column] >= _WHOLE for row, (column, _) in placed.items()
        )
        return PolicyDecision(runs=runs)

    def quiet_until(self, now: float) -> float:
        # Otherwise the rounds time-slice, so any round may differ from the last.
        return UNTIL_NEXT_EVENT if self._settled else EVERY_QUANTUM

    # The allocation -----------------------------------------------------------------------

    def allocation(self) -> dict[str, dict[str, float]]:
        """The current X per active job and generation (after the last decision)."""
        return {
            entry.spec.id: {
                generation: float(self._x[row, column])
                for column, generation in enumerate(self._generations)
            }
            for row, entry in enumerate(self._rows)
        }

    def _allocate(self) -> None:
        """Re-solve for the active jobs; carry each continuing job's deficit over."""
        began = time.perf_counter()
        owed = self._deficit + self._x * self._elapsed - self._received
        entries = list(self._entries.values())
        generations = len(self._generations)
        deficit = np.zeros((len(entries), generations))
        old_rows = np.array([entry.row for entry in entries], dtype=np.int64)
        kept = old_rows >= 0
        if kept.any():
            deficit[kept] = owed[old_rows[kept]]
        classes: dict[tuple[str | None, int, float], int] = {}
        speed: list[list[float]] = []
        held: list[list[int]] = []
        gpus: list[float] = []
        weight: list[float] = []
        count: list[float] = []
        for row, entry in enumerate(entries):
            spec = entry.spec
            share = self._tickets.get(spec.user, self._default_tickets)
            per_job = share / self._user_jobs[spec.user]
            key = (spec.job_type, spec.gpus, per_job)
            cls = classes.get(key)
            if cls is None:
                cls = classes[key] = len(speed)
                speed.append(entry.speed)
                held.append(entry.held)
                gpus.append(float(spec.gpus))
                weight.append(per_job)
                count.append(0.0)
            count[cls] += 1.0
            entry.cls = cls
            entry.row = row
        solved = max_min_allocation(
            np.array(speed, dtype=np.float64).reshape(-1, generations),
            np.array(held, dtype=np.float64).reshape(-1, generations),
            np.array(gpus),
            np.array(weight),
            np.array(count),
            self._capacity,
            pareto=self.config.pareto,
            solver=self._solver,
        )
        index = np.array([entry.cls for entry in entries], dtype=np.int64)
        self._x = solved.x[index] if entries else np.zeros((0, generations))
        self._fits = np.array([entry.held for entry in entries], dtype=bool).reshape(
            -1, generations
        )
        self._rows = entries
        self._deficit = deficit
        self._received = np.zeros((len(entries), generations))
        self._elapsed = 0
        self._changed = False
        self.t = solved.t
        self.solves += 1
        self.solve_s += time.perf_counter() - began

    # One round ----------------------------------------------------------------------------

    def _queue(self) -> list[int]:
        """Fitting (row, generation column) pairs as flat indices ``row * generations + column``,
        in priority order (module docstring)."""
        x = self._x
        if self._elapsed:
            served = self._received > 0
            fraction = np.where(served, self._received, 1.0) / self._elapsed
            priority = np.where(served, x / fraction, x * _UNSERVED)
        else:
            priority = x * _UNSERVED
        # lexsort: last key first; stable, so equal keys keep submission order (rows are in
        # submission order, and generations fastest first within a row).
        order = np.lexsort((-x.ravel(), -self._deficit.ravel(), -priority.ravel()))
        queue: list[int] = order[self._fits.ravel()[order]].tolist()
        return queue

    def _choose(self) -> dict[int, int]:
        """Row -> generation column for this round, by GPU count (placement comes after)."""
        chosen: dict[int, int] = {}
        rows = self._rows
        free = [int(gpus) for gpus in self._capacity]
        left = sum(free)
        generations = len(self._generations)
        self._order = self._queue()
        for flat in self._order:
            if left == 0:
                break
            row, column = divmod(flat, generations)
            if row in chosen:
                continue
            need = rows[row].held[column]
            if need <= free[column]:
                chosen[row] = column
                free[column] -= need
                left -= need
        return chosen

    def _place(self, chosen: dict[int, int]) -> dict[int, tuple[int, Holding]]:
        """Servers for the chosen rows: previous ones first, largest gangs first per pool."""
        occupancy = Occupancy(self._cluster)
        rows = self._rows
        placed: dict[int, tuple[int, Holding]] = {}
        failed = False
        by_column: dict[int, list[int]] = {}
        for row, column in chosen.items():
            by_column.setdefault(column, []).append(row)
        for column, members in by_column.items():
            generation = self._generations[column]
            members.sort(key=lambda r: -rows[r].held[column])
            start = 0
            while start < len(members):
                size = rows[members[start]].held[column]
                stop = start
                while stop < len(members) and rows[members[stop]].held[column] == size:
                    stop += 1
                group = members[start:stop]
                rest: list[int] = []
                for row in group:
                    last = rows[row].last
                    taken = None
                    if last is not None and last.generation == generation:
                        taken = occupancy.take(last.servers, rows[row].spec.gpus)
                    if taken is None:
                        rest.append(row)
                    else:
                        placed[row] = (column, taken)
                for row in rest:
                    placement = occupancy.place(rows[row].spec.gpus, (generation,))
                    if placement is None:
                        failed = True
                    else:
                        placed[row] = (column, placement)
                start = stop
        if failed:
            self._backfill(occupancy, placed)
        return placed

    def _backfill(self, occupancy: Occupancy, placed: dict[int, tuple[int, Holding]]) -> None:
        """Fragmentation left a chosen gang without room: let the next jobs that fit use it."""
        rows = self._rows
        free = [sum(occupancy.free[s.id] for s in servers) for servers in self._servers]
        left = sum(free)
        generations = len(self._generations)
        for flat in self._order:
            if left == 0:
                break
            row, column = divmod(flat, generations)
            if row in placed or rows[row].held[column] > free[column]:
                continue
            placement = occupancy.place(rows[row].spec.gpus, (self._generations[column],))
            if placement is not None:
                placed[row] = (column, placement)
                free[column] -= placement.held
                left -= placement.held
