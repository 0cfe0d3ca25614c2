"""The kernel's job input kept up to date: each runnable job's `JobState` and each user's queue
of them by (pass, arrival), changed only where jobs changed, so that a snapshot (`snapshot`)
costs what changed since the last one, not a pass over every job.

The machine marks a job (`touch`) wherever anything a `JobState` is made of changes: it is
admitted or ends; a residency is added, dropped or told to stop; it is placed on other servers;
its pass, attempt, exit, retry delay, parking or measured switches change. Speeds are kept per
gang shape: a user's profile of a job type forgets its gangs of that type and remakes its
jobs' states of that type (`profiled`); a change of the pools, every one.
A job whose retry delay runs, or whose prepared process it waits for, is looked at again at
every snapshot, since whether it may run depends on the time.

The states handed out are the machine's own: the kernel's `decide` and `backfill` read them,
and the booking of a quantum (`turns`) lets the kernel's `settle` advance the passes of those
that ran, then puts them in their new places (`repass`) before anything reads the queues again:
a job that runs on is not made again every quantum.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from gfair.core.kernel import JobState

from .snapshot import job_state

if TYPE_CHECKING:
    from .machine import SplitStride

Shape = tuple[str, str | None, int]  # user, job type, GPUs: what a job's speeds depend on


class _Queue:
    """One user's runnable jobs by (pass, arrival number), and its position among the users
    (the arrival position of its earliest runnable job)."""

    __slots__ = ("_order", "_states", "_view", "first")

    def __init__(self) -> None:
        self._order: list[tuple[float, int]] = []
        self._states: list[JobState] = []
        self._view: tuple[JobState, ...] | None = ()
        self.first = 0

    def add(self, state: JobState) -> None:
        at = bisect_left(self._order, (state.pass_, state.seq))
        self._order.insert(at, (state.pass_, state.seq))
        self._states.insert(at, state)
        self._view = None

    def remove(self, state: JobState) -> None:
        at = bisect_left(self._order, (state.pass_, state.seq))
        del self._order[at]
        del self._states[at]
        self._view = None

    def repass(self, state: JobState, before: float) -> None:
        """`state`'s pass moved on from `before`: it takes its new place."""
        at = bisect_left(self._order, (before, state.seq))
        del self._order[at]
        del self._states[at]
        self.add(state)

    def __len__(self) -> int:
        return len(self._states)

    def view(self, positions: Mapping[str, int]) -> tuple[JobState, ...]:
        if self._view is None:
            self._view = tuple(self._states)
            self.first = min((positions[s.id] for s in self._states), default=0)
        return self._view


class Queues:
    """The states of a machine's runnable jobs and its users' queues of them (module doc)."""

    def __init__(self) -> None:
        self._states: dict[str, JobState] = {}  # runnable job -> its state
        self._queues: dict[str, _Queue] = {}
        self._touched: set[str] = set()
        self._delayed: set[str] = set()  # jobs with a retry delay: runnable from a time on
        self._speeds: dict[Shape, dict[str, float]] = {}
        self._pool_gpus: dict[str, int] | None = None
        self._in_arrays: dict[str, set[str]] = {}  # user -> its runnable jobs in job arrays
        self._running: dict[str, JobState] = {}  # the runnable jobs running (whole gangs)
        # Each user's queue as last handed out, the users whose queues changed since, and the
        # last answer (users in order), until one does.
        self._views: dict[str, tuple[JobState, ...]] = {}
        self._stale: set[str] = set()
        self._answer: dict[str, tuple[JobState, ...]] = {}

    def touch(self, key: str) -> None:
        """Something `key`'s state is made of changed (or the job came or went)."""
        self._touched.add(key)

    def profiled(self, user: str, job_type: str | None, keys: Iterable[str]) -> None:
        """`user`'s profile of `job_type` changed: the speeds of its gangs of that type are
        worked out again, and the states of its jobs of that type (`keys`) made again. A
        profile is the user's (`ThroughputEstimator.type_speeds` reads the user's rates of the
        type only), so nobody else's state changes."""
        for shape in [s for s in self._speeds if s[0] == user and s[1] == job_type]:
            del self._speeds[shape]
        self._touched.update(keys)

    def repass(self, ran: Sequence[JobState], before: Sequence[float]) -> None:
        """The booking of a quantum advanced the passes of the states `ran` (the machine's
        own, handed out by the last `refresh`) from `before`: they take their new places in
        their users' queues. Nothing else a state is made of changes when its job runs on, so
        the state is kept rather than made again."""
        for state, was in zip(ran, before, strict=True):
            self._queues[state.user].repass(state, was)
            self._stale.add(state.user)

    def refresh(
        self, machine: SplitStride, now: float, pool_gpus: dict[str, int]
    ) -> dict[str, tuple[JobState, ...]]:
        """User -> its runnable jobs' states in its order, the users in the order of their
        earliest runnable job's arrival (`machine.positions`), as of `now`. (The machine's
        own: read it, never change it.)"""
        jobs = machine.jobs
        if pool_gpus != self._pool_gpus:
            self._speeds.clear()
            self._pool_gpus = dict(pool_gpus)
            self._touched.update(jobs)
        touched = self._touched | self._delayed
        self._touched = set()
        positions = machine.positions
        operator = machine.config.operator_costs
        stale = self._stale
        for key in touched:
            old = self._states.pop(key, None)
            if old is not None:
                self._queues[old.user].remove(old)
                stale.add(old.user)
                self._in_arrays.get(old.user, set()).discard(key)
                self._running.pop(key, None)
            job = jobs.get(key)
            if job is None or job.waits_until is None:
                self._delayed.discard(key)
            else:
                self._delayed.add(key)
            if job is None or not machine.runnable(job, now):
                continue
            shape = (job.user, job.job_type, job.gpus)
            speeds = self._speeds.get(shape)
            if speeds is None:
                speeds = self._speeds[shape] = machine.estimator.gang_speeds(
                    key, job.user, job.job_type, job.gpus, pool_gpus
                )
            state = self._states[key] = job_state(job, speeds, operator)
            self._queues.setdefault(job.user, _Queue()).add(state)
            stale.add(job.user)
            if job.array is not None:
                self._in_arrays.setdefault(job.user, set()).add(key)
            if state.running:
                self._running[key] = state
        if not stale:
            return self._answer
        views, queues = self._views, self._queues
        for user in stale:
            queue = queues.get(user)
            if queue:
                views[user] = queue.view(positions)
            else:
                queues.pop(user, None)
                views.pop(user, None)
        stale.clear()
        ordered = sorted((queues[user].first, user) for user in views)
        self._answer = {user: views[user] for _, user in ordered}
        return self._answer

    def states(self, keys: Iterable[str]) -> list[JobState]:
        """The states of `keys` (runnable jobs, as of the last `refresh`)."""
        states = self._states
        return [states[key] for key in keys]

    def least_waiting(self) -> int | None:
        """The fewest GPUs a runnable job that does not run asks, as of the last `refresh`
        (None: every one runs)."""
        return min((s.gpus for s in self._states.values() if not s.running), default=None)

    def running(self) -> list[JobState]:
        """The states of the runnable jobs whose whole gang runs, as of the last `refresh`."""
        return list(self._running.values())

    def in_arrays(self) -> dict[str, set[str]]:
        """User -> its runnable jobs in job arrays (those users' queues are cut to the
        arrays' limits)."""
        return {user: keys for user, keys in self._in_arrays.items() if keys}
