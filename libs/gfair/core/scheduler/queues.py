"""The kernel's job input, part of the machine's index (`index`): each runnable job's
`RunnableJob` and each user's queue of them by (pass, arrival), made again only for the jobs
touched since (`touch`: anything a state is made of changed), so that a snapshot costs what
changed since the last one. Speeds are kept per gang shape (a profile forgets its user's gangs of
its type, a change of the pools every one); a job whose retry delay runs, or that waits for its
prepared process, is looked at again at every snapshot, since whether it may run depends on the
time. A touched job still runnable keeps its state, brought up to date in place (`restate`), and
only what moved takes a new place. The states and queues handed out are the index's own: the
kernel reads them, and books a quantum into copies, which take their places (`repass`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from gfair.core.kernel import RunnableJob

from .snapshot import job_state, restate

if TYPE_CHECKING:
    from .machine import SplitStride

Shape = tuple[str, str | None, int]  # user, job type, GPUs: what a job's speeds depend on


class _UserQueue:
    """One user's runnable jobs by (pass, arrival number), and its position among the users
    (the arrival number of its earliest runnable job)."""

    __slots__ = ("_order", "first", "states")

    def __init__(self) -> None:
        self._order: list[tuple[float, int]] = []
        self.states: list[RunnableJob] = []  # (handed out as kept: read it, never change it)
        self.first = 0

    def add(self, state: RunnableJob) -> bool:
        """Whether the user's position changed."""
        at = bisect_left(self._order, (state.pass_, state.seq))
        self._order.insert(at, (state.pass_, state.seq))
        self.states.insert(at, state)
        if len(self.states) == 1 or state.seq < self.first:
            self.first = state.seq
            return True
        return False

    def remove(self, state: RunnableJob) -> bool:
        """Whether the user's position changed (or it has no runnable job left)."""
        at = bisect_left(self._order, (state.pass_, state.seq))
        del self._order[at]
        del self.states[at]
        if not self.states:
            return True
        if state.seq == self.first:
            self.first = min(s.seq for s in self.states)
            return self.first != state.seq
        return False

    def repass(self, state: RunnableJob, before: float) -> None:
        """`state` (its pass moved on from `before`) takes its predecessor's place, and its own."""
        if len(self._order) == 1:  # (most users have one runnable job)
            self._order[0] = (state.pass_, state.seq)
            self.states[0] = state
            return
        at = bisect_left(self._order, (before, state.seq))
        del self._order[at]
        del self.states[at]
        at = bisect_left(self._order, (state.pass_, state.seq))
        self._order.insert(at, (state.pass_, state.seq))
        self.states.insert(at, state)


class Queues:
    """The states of a machine's runnable jobs and its users' queues of them (module doc)."""

    def __init__(self) -> None:
        self._states: dict[str, RunnableJob] = {}  # runnable job -> its state
        self._queues: dict[str, _UserQueue] = {}
        # The jobs `touch` marked since the last refresh (the machine adds to it at once: it
        # marks a job at every turn).
        self.touched: set[str] = set()
        self._delayed: set[str] = set()  # jobs with a retry delay: runnable from a time on
        self._speeds: dict[Shape, dict[str, float]] = {}
        self._pool_gpus: dict[str, int] | None = None
        self._in_arrays: dict[str, set[str]] = {}  # user -> its runnable jobs in job arrays
        self._running: dict[str, RunnableJob] = {}  # the runnable jobs running (whole gangs)
        # GPUs asked -> how many runnable jobs asking that many do not run (`least_waiting`).
        self._waiting: dict[int, int] = {}
        # The last answer (users in order), until a user's queue comes, goes, or its earliest
        # runnable job changes.
        self._answer: dict[str, Sequence[RunnableJob]] = {}
        self._reorder = False

    def touch(self, key: str) -> None:
        """Something `key`'s state is made of changed (or the job came or went)."""
        self.touched.add(key)

    def profiled(self, user: str, job_type: str | None, keys: Iterable[str]) -> None:
        """`user`'s profile of `job_type` changed: the speeds of its gangs of that type are
        worked out again, and the states of its jobs of that type (`keys`) made again. A
        profile is the user's (`ThroughputEstimator.type_speeds` reads the user's rates of the
        type only), so nobody else's state changes."""
        for shape in [s for s in self._speeds if s[0] == user and s[1] == job_type]:
            del self._speeds[shape]
        self.touched.update(keys)

    def repass(self, ran: Iterable[RunnableJob]) -> None:
        """The booking of a quantum advanced the passes of the jobs that ran: `ran`, their
        states as booked (copies of those the last `refresh` handed out, passes aside), take
        their places in their users' queues. Nothing else a state is made of changes when its
        job runs on, so the booked state is kept rather than made again."""
        queues, states, running = self._queues, self._states, self._running
        for state in ran:
            key = state.id
            queues[state.user].repass(state, states[key].pass_)
            states[key] = state
            if key in running:
                running[key] = state

    def refresh(
        self, machine: SplitStride, now: float, pool_gpus: dict[str, int]
    ) -> Mapping[str, Sequence[RunnableJob]]:
        """User -> its runnable jobs' states in its order, the users in the order of their
        earliest runnable job's arrival, as of `now` (the index's own: read it, never change
        it)."""
        jobs = machine.jobs
        if pool_gpus != self._pool_gpus:
            self._speeds.clear()
            self._pool_gpus = dict(pool_gpus)
            self.touched.update(jobs)
        touched = self.touched
        if self._delayed:
            touched |= self._delayed
        if not touched:
            return self._ordered() if self._reorder else self._answer
        operator = machine.config.operator_costs
        states, running, waiting = self._states, self._running, self._waiting
        for key in touched:
            job = jobs.get(key)
            if job is None or (job.runnable_at is None and job.coming_up_until is None):
                self._delayed.discard(key)  # (`Job.waits_until` is None)
            else:
                self._delayed.add(key)
            old = states.get(key)
            if job is None or not machine.runnable(job, now):
                if old is not None:
                    self._drop(key, old)
                continue
            shape = (job.user, job.job_type, job.gpus)
            speeds = self._speeds.get(shape)
            if speeds is None:
                speeds = self._speeds[shape] = machine.estimator.gang_speeds(
                    key, job.user, job.job_type, job.gpus, pool_gpus
                )
            if old is None:
                state = states[key] = job_state(job, speeds, operator)
                queue = self._queues.get(job.user)
                if queue is None:
                    queue = self._queues[job.user] = _UserQueue()
                if queue.add(state):
                    self._reorder = True
                if job.array is not None:
                    self._in_arrays.setdefault(job.user, set()).add(key)
                if state.running:
                    running[key] = state
                else:
                    waiting[state.gpus] = waiting.get(state.gpus, 0) + 1
                continue
            ran, before = bool(old.running), old.pass_
            restate(old, job, speeds, operator)
            if old.pass_ != before:
                self._queues[job.user].repass(old, before)
            if bool(old.running) != ran:
                if ran:
                    del running[key]
                    waiting[old.gpus] = waiting.get(old.gpus, 0) + 1
                else:
                    running[key] = old
                    waiting[old.gpus] -= 1
        touched.clear()  # (nothing above marks a job)
        return self._ordered() if self._reorder else self._answer

    def _drop(self, key: str, state: RunnableJob) -> None:
        del self._states[key]
        queue = self._queues[state.user]
        if queue.remove(state):
            self._reorder = True
        if not queue.states:
            del self._queues[state.user]
        self._in_arrays.get(state.user, set()).discard(key)
        if state.running:
            del self._running[key]
        else:
            self._waiting[state.gpus] -= 1

    def _ordered(self) -> Mapping[str, Sequence[RunnableJob]]:
        queues = self._queues
        ordered = sorted((queue.first, user) for user, queue in queues.items())
        self._answer = {user: queues[user].states for _, user in ordered}
        self._reorder = False
        return self._answer

    def states(self, keys: Iterable[str]) -> list[RunnableJob]:
        """The states of `keys` (runnable jobs, as of the last `refresh`)."""
        states = self._states
        return [states[key] for key in keys]

    def least_waiting(self) -> int | None:
        """The fewest GPUs a runnable job that does not run asks, as of the last `refresh`
        (None: every one runs)."""
        return min((gpus for gpus, count in self._waiting.items() if count), default=None)

    def running(self) -> list[RunnableJob]:
        """The states of the runnable jobs whose whole gang runs, as of the last `refresh`."""
        return list(self._running.values())

    def in_arrays(self) -> dict[str, set[str]]:
        """User -> its runnable jobs in job arrays (those users' queues are cut to the
        arrays' limits)."""
        return {user: keys for user, keys in self._in_arrays.items() if keys}
