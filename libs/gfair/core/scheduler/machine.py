"""The split-stride state machine: the jobs admitted and where they run, the servers, the users'
accounts; events in (`apply`), plans out (`tick`). See the package's docstring."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from gfair.core.kernel import RunnableJob, Snapshot, UserState
from gfair.core.throughput import ThroughputEstimator

from . import preparing, reports, snapshot, turns
from .config import SchedulerConfig
from .events import (
    Admitted,
    CarriedOut,
    Ended,
    EntitlementsPublished,
    Event,
    Exited,
    Migrated,
    Node,
    NodeHealth,
    Parked,
    Releases,
    Retried,
    ServersChanged,
    Started,
    Suspended,
    SwitchesMeasured,
    Tick,
    TypeProfiled,
    Unstartable,
)
from .index import Index, differences, rebuild
from .plan import CHANGED, UNCHANGED, QuantumPlan, Reply, Starts, Stop, StopReason, TimedOut
from .residency import Phase, SchedulerJob, Stay, Switches, duration, job_key
from .usage import Meter

Journal = Callable[[Event | Tick, Reply | QuantumPlan], None]
Profiles = dict[str, dict[str | None, Mapping[str, float]]]  # user -> job type -> pool -> speed


@dataclass
class Saved:
    """What a machine is restored from (and what a driver persists): all but what a restart
    may forget (overrun and unheld seconds, moved jobs held back, where processes are parked,
    prepared starts waiting)."""

    usage_since: float
    quantum: int = 0  # the next quantum to decide
    last_tick_at: float | None = None
    seq: int = 0  # the last arrival number given (users and jobs)
    users: dict[str, UserState] = field(default_factory=dict)
    profiles: Profiles = field(default_factory=dict)
    nodes: tuple[Node, ...] = ()
    jobs: dict[str, SchedulerJob] = field(default_factory=dict)
    usage: dict[str, dict[str, float]] = field(default_factory=dict)
    entitlements: dict[str, dict[str, float]] = field(default_factory=dict)
    entitlements_revision: int = -1


class SplitStride:
    def __init__(
        self,
        config: SchedulerConfig,
        estimator: ThroughputEstimator,
        saved: Saved | None = None,
        *,
        journal: Journal | None = None,
        check: bool = False,
    ) -> None:
        saved = saved or Saved(usage_since=0.0)
        self.config = config
        self.estimator = estimator
        # Called with every input applied and what came of it (a replay feeds the inputs to a
        # machine restored alike and must get the same outputs).
        self.journal = journal
        self.quantum = saved.quantum
        self.seq = saved.seq
        self.users = saved.users
        self.profiles = saved.profiles
        for user, types in self.profiles.items():
            for job_type, rates in types.items():
                estimator.observe_profile(user, job_type, rates)
        self.entitlements = saved.entitlements
        self.entitlements_revision = saved.entitlements_revision
        self.nodes = {node.node_id: node for node in saved.nodes}
        self.jobs = saved.jobs
        self.meter = Meter(
            config.quantum_s, config.usage_gap_s, saved.usage, saved.usage_since, saved.last_tick_at
        )
        # In memory only (a restart forgets them): jobs the last quantum moved that wait for
        # their old nodes to let go before they start on their new servers, whose GPUs are
        # promised to them meanwhile (after a restart the next quantum decides anew); node ->
        # jobs prepared there (held to its GPUs in number, `preparing`; pruned as it is read).
        self._held_back: set[str] = set()
        self.preparing: dict[str, set[str]] = {}
        for key, job in self.jobs.items():
            if preparing.waits_prepared(job):
                self.preparing.setdefault(job.servers[0], set()).add(key)
        self._changed: set[str] = set()  # since `take_changed` (a driver saves these)
        # Every cache derived from the above (module `index`): told of each change here.
        self.index = Index(self.jobs, saved.nodes, ())
        # Rebuild the index after every input and compare (the tests: `index.differences`).
        self.check = check
        self._checked_at = 0.0

    # -- inputs -------------------------------------------------------------------------------

    def apply(self, event: Event) -> Reply:
        """Fold `event` in; what changed and what follows from it."""
        reply = self._apply(event)
        if self.journal is not None:
            self.journal(event, reply)
        if self.check:
            self._check(getattr(event, "now", None))
        return reply

    def tick(self, now: float, heard_until: float | None = None) -> QuantumPlan:
        """Decide the next quantum at `now` and book it; `heard_until` as `Tick`'s."""
        timed_out = self._time_limits(now)
        plan = turns.decide_quantum(self, now, now if heard_until is None else heard_until)
        if timed_out:
            plan = replace(plan, timed_out=timed_out)
        if self.journal is not None:
            self.journal(Tick(now, heard_until), plan)
        if self.check:
            self._check(now)
        return plan

    def _check(self, now: float | None) -> None:
        """Check mode: the index kept as inputs arrived answers what one derived from the state
        alone answers, its queues as of `now` (an input without a time: the last one's)."""
        self._checked_at = self._checked_at if now is None else now
        found = differences(self.index, rebuild(self), self, self._checked_at)
        if found:
            raise AssertionError("the machine's index went stale:\n" + "\n".join(found))

    def _apply(self, event: Event) -> Reply:
        match event:  # (the most frequent first: the inputs are of distinct types)
            case Started():
                return CHANGED if reports.confirmed(self, event) else UNCHANGED
            case CarriedOut():
                return self._carried_out(event)
            case Releases():
                return self._released(event.reports)
            case Suspended() | Migrated() | Exited():
                return self._released((event,))
            case Admitted():
                return self._admitted(event)
            case Parked():
                return self._parked(event)
            case Retried():
                if not self._retried(event):
                    return UNCHANGED
                return Reply(
                    True, starts=turns.start_at_once(self, event.key, event.now, arrival=True)
                )
            case Ended():
                return self._ended(event)
            case Unstartable():
                job = self.jobs.get(event.key)
                gone = job is not None and self.unreside(job, event.node_id) is not None
                return CHANGED if gone else UNCHANGED
            case ServersChanged():
                return CHANGED if self._servers(event.nodes) else UNCHANGED
            case EntitlementsPublished():
                if event.revision <= self.entitlements_revision:
                    return UNCHANGED
                self.entitlements_revision = event.revision
                self.entitlements = {u: dict(p) for u, p in event.entitlements.items()}
                return CHANGED
            case TypeProfiled():
                types = self.profiles.setdefault(event.user, {})
                if types.get(event.job_type) == event.rates:
                    return UNCHANGED
                types[event.job_type] = dict(event.rates)
                self.estimator.observe_profile(event.user, event.job_type, event.rates)
                mine = self.index.of_user.get(event.user, {})
                of_type = (k for k in mine if self.jobs[k].job_type == event.job_type)
                self.index.queues.profiled(event.user, event.job_type, of_type)
                return CHANGED
            case SwitchesMeasured():
                # An older estimate (fewer reports, a redelivery) than the one held: nothing.
                job = self.jobs.get(event.key)
                held = job.switches if job is not None else None
                if job is None or (held is not None and event.reports <= held.reports):
                    return UNCHANGED
                job.switches = Switches(event.reports, event.switches)
                self.touch(job.key)
                return CHANGED
        raise TypeError(f"not an input of the state machine: {event!r}")

    # -- jobs coming and going ----------------------------------------------------------------

    def _admitted(self, event: Admitted) -> Reply:
        """A newly admitted job (and its user's account when it is the user's first): it starts
        at once where GPUs are idle, else, opted in, its process starts prepared somewhere."""
        key, user = event.key, event.user
        if key in self.jobs:
            return UNCHANGED
        if user not in self.users:
            self.users[user] = UserState(user, self.next_seq())
            self.index.entitled_for = None
        index = self.index
        job = SchedulerJob(
            user=user,
            job_id=event.job_id,
            gpus=event.gpus,
            weight=event.weight,
            job_type=event.job_type,
            seq=self.next_seq(),
            stride_pass=index.joining_pass(user),
            attempt=event.attempt,
            array=event.array,
            array_limit=event.array_limit,
            prepare=event.prepare,
            costs=event.costs,
            launch=event.launch,
        )
        self.jobs[key] = job
        index.of_user.setdefault(user, {})[key] = None
        index.jobs_changed(user, first_changed=False)  # (a user's first job is its earliest)
        self.touch(key)
        starts = turns.start_at_once(self, key, event.now, arrival=True)
        prepared = preparing.prepare(self, job, event.now) if event.prepare else None
        return Reply(True, starts=starts, prepares=() if prepared is None else (prepared,))

    def _released(self, given: tuple[Suspended | Migrated | Exited, ...]) -> Reply:
        """Processes let go: a job that waited for its old node to let go may start at once
        where it moved; after the last report, GPUs still idle go to waiting jobs."""
        starts = Starts()
        changed = False
        ignored: list[str] = []
        coming_up: list[Suspended] = []  # forced off while they came up
        for report in given:
            job = self.jobs.get(report.key)
            stay = job.stays.get(report.node_id) if job is not None else None
            # A start sent since is still on its way (its stop too): it is the one to go by.
            superseded = stay is not None and stay.pending_suspends > 1
            reply = reports.released(self, report)
            if reply.ignored is not None:
                ignored.append(reply.ignored)
            if reply.changed:
                changed = True
                if report.key in self._held_back:  # (no other job starts on a release)
                    starts += turns.start_at_once(self, report.key, report.now, arrival=False)
            if isinstance(report, Suspended) and job is not None and not superseded:
                if report.starting:
                    coming_up.append(report)
                elif preparing.came_up(self, job):
                    changed = True
        why = "; ".join(ignored) or None
        if not changed:
            return Reply(False, ignored=why)
        starts += turns.fill(self, given[-1].now)
        # Those the fill did not start again come up without GPUs first.
        prepares = tuple(
            prepared
            for report in coming_up
            if (job := self.jobs.get(report.key)) is not None
            and not job.stays
            and (prepared := preparing.after_start_up(self, job, report)) is not None
        )
        return Reply(True, starts=starts, prepares=prepares, ignored=why)

    def _carried_out(self, event: CarriedOut) -> Reply:
        """Nodes that act at once ran `event.stops`, then `event.starts`: folded in as their
        reports would be (`CarriedOut`), without making them. What the releases let start is
        the answer, as `Releases`'s."""
        now = event.now
        jobs = self.jobs
        changed = False
        starts = Starts()
        for stop in event.stops:
            reason = stop.reason
            if not isinstance(reason, StopReason) or reason is StopReason.RELEASE:
                continue  # a kill, or a parked process let go: nothing waits for those
            key = job_key(stop.user, stop.job_id)
            job = jobs.get(key)
            if job is None:
                continue
            # (As `_released`, for a `Suspended` not in place nor coming up, or a `Migrated`.)
            suspended = reason is not StopReason.MIGRATION
            stay = job.stays.get(stop.node_id)
            superseded = stay is not None and stay.pending_suspends > 1
            if reports.let_go(self, job, stop.node_id, now, now, suspended=suspended).changed:
                changed = True
                if key in self._held_back:
                    starts += turns.start_at_once(self, key, now, arrival=False)
            if suspended and not superseded and preparing.came_up(self, job):
                changed = True
        if changed:
            starts += turns.fill(self, now)
        for start in event.starts:
            job = jobs.get(job_key(start.user, start.job_id))
            if job is not None:
                reports.started(
                    self, job, start.node_id, start.attempt, start.gpu_indices, now, now
                )
        return Reply(True, starts=starts) if changed else UNCHANGED

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _parked(self, event: Parked) -> Reply:
        """A prepared start parked: held as parked there (on any of its GPUs), unless the job
        started elsewhere meanwhile, was retried or ended: then that node lets it go."""
        job = self.jobs.get(event.key)
        node_id = event.node_id
        if job is not None and job.attempt == event.attempt and not job.exited:
            waited = preparing.came_up(self, job)
            if not job.stays:
                self.park(job, (node_id, ()))
                # It may run now: on GPUs left idle meanwhile, at once.
                return Reply(True, starts=turns.fill(self, event.now)) if waited else CHANGED
            if node_id in job.stays:
                return CHANGED  # its start there is on its way: the node resumes it in place
        # Not wanted there (any more): the process exits, it has nothing to save.
        release = Stop(event.user, event.job_id, node_id, event.attempt, StopReason.RELEASE)
        return Reply(True, stops=(release,))

    def _ended(self, event: Ended) -> Reply:
        """Forget a job that ended for good and kill what is left of it; its GPUs go to waiting
        jobs now (a node runs the kill before any start)."""
        kills = self._end(event.user, event.job_id, f"the job is {event.state}")
        if kills is None:
            return UNCHANGED
        return Reply(True, stops=kills, starts=turns.fill(self, event.now))

    def _time_limits(self, now: float) -> tuple[TimedOut, ...]:
        """End the jobs whose running time passed their limit (the one place it is enforced:
        at a tick, so a job runs at most a quantum past it). Only a job on GPUs can pass it."""
        ended: list[TimedOut] = []
        for job in self.index.resident_jobs():
            limit = None if job.launch is None else job.launch.time_limit
            if limit is None or (ran := job.running_s(now)) < limit:
                continue
            reason = f"time limit {duration(limit)} reached after {duration(ran)} running"
            for stay in job.stays.values():  # charged up to now, as the tick charges the rest
                if stay.phase is Phase.RUNNING:
                    self.meter.held(job, stay, self.pool(job, stay), now)
            kills = self._end(job.user, job.job_id, reason) or ()
            ended.append(TimedOut(job.user, job.job_id, job.attempt, reason, kills))
        return tuple(ended)

    def _end(self, user: str, job_id: str, reason: str) -> tuple[Stop, ...] | None:
        """Forget the job (None: unknown); the kills of what is left of it. A user with no jobs
        left leaves with its account (it comes back as a newcomer)."""
        key = job_key(user, job_id)
        job = self.jobs.pop(key, None)
        index = self.index
        mine = index.of_user.get(user, {})
        earliest = next(iter(mine), None) == key
        mine.pop(key, None)
        index.min_pass.pop(user, None)
        if job is None:
            return None
        # Out of the node indexes (its stays stay on it, to be killed).
        for stay in job.stays.values():
            index.resided(key, stay, None)
        index.parked(key, None if job.parked is None else job.parked[0], None)
        self.touch(key)
        if not mine:
            self.users.pop(user, None)
            index.entitled_for = None
            index.of_user.pop(user, None)
        index.jobs_changed(user, first_changed=earliest and bool(mine))
        kills = [
            Stop(job.user, job.job_id, node_id, stay.attempt, reason)
            for node_id, stay in sorted(job.stays.items())
            if stay.holds_gpus
        ]
        if job.parked is not None and job.parked[0] not in job.stays:
            # Its process parked in place there holds no GPU, but lives.
            kills.append(Stop(job.user, job.job_id, job.parked[0], job.attempt, reason))
        return tuple(kills)

    def _retried(self, event: Retried) -> bool:
        job = self.jobs.get(event.key)
        if job is None or event.attempt < job.attempt:
            return False
        job.attempt = event.attempt
        job.exited = False
        job.runnable_at = event.at + event.delay_s if event.delay_s > 0 else None
        self.touch(job.key)
        return True

    def _servers(self, nodes: tuple[Node, ...]) -> bool:
        before = self.nodes
        if nodes == tuple(before.values()):
            return False
        self.nodes = {node.node_id: node for node in nodes}
        self.index.set_nodes(nodes)
        for node in nodes:
            was = before.get(node.node_id)
            if node.health is NodeHealth.FAILED and was is not None and was.health != node.health:
                for key in list(self.index.stays_on(node.node_id)):
                    self.unreside(self.jobs[key], node.node_id)  # its processes died with it
        return True

    # -- queries ------------------------------------------------------------------------------

    def snapshot(self, now: float) -> Snapshot:
        """What the kernel would decide from at `now` (`snapshot`; it refreshes entitlements),
        its job queues copied: the machine's own change as inputs arrive."""
        view = snapshot.snapshot(self, now)
        return replace(view, jobs={user: tuple(queue) for user, queue in view.jobs.items()})

    @property
    def last_tick_at(self) -> float | None:
        return self.meter.last_tick_at

    def job(self, user: str, job_id: str) -> SchedulerJob | None:
        return self.jobs.get(job_key(user, job_id))

    def pool(self, job: SchedulerJob, stay: Stay) -> str:
        node = self.nodes.get(stay.node_id)
        return node.generation if node is not None else job.generation or "unknown"

    def runnable(self, job: SchedulerJob, now: float) -> bool:
        """A job may run when its process has not exited awaiting the failure detector's
        verdict, a retry's delay is over, a prepared start it waits for parked (or it waited
        long enough: `preparing.after_start_up`), and it holds no residency outside the servers the
        kernel last placed it on (a moved job starts on its new servers only once its old
        node let go)."""
        if job.exited:
            return False
        if (until := job.waits_until) is not None and until > now:
            return False
        return all(map(job.servers.__contains__, job.stays))

    def held(self) -> dict[str, dict[str, float]]:
        """GPUs each user holds per pool now (its received share)."""
        held: dict[str, dict[str, float]] = {}
        for job in self.jobs.values():
            gpus = sum(len(s.gpu_indices) for s in job.stays.values() if s.holds_gpus)
            if gpus and job.generation is not None:
                pools = held.setdefault(job.user, {})
                pools[job.generation] = pools.get(job.generation, 0.0) + gpus
        return held

    # -- changes of state, told to the index --------------------------------------------------

    def touch(self, key: str) -> None:
        """Something `key`'s kernel state is made of changed (or the job came or went): its
        state is made again (`Queues.touch`), and the job is saved again (`changed`)."""
        self.index.queues.touch(key)
        self._changed.add(key)
        if key in self._held_back:
            self.index.promise(key, True)  # its servers may have changed, or it went

    @property
    def held_back(self) -> set[str]:
        """Jobs the last quantum moved that wait for their old nodes to let go (read it; it
        changes through its setter and `let_go` alone)."""
        return self._held_back

    @held_back.setter
    def held_back(self, keys: set[str]) -> None:
        old, self._held_back = self._held_back, keys
        for key in old | keys:
            self.index.promise(key, key in keys)

    def let_go(self, key: str) -> None:
        """`key` waits no more: the GPUs promised to it are free to others."""
        self._held_back.discard(key)
        self.index.promise(key, False)

    def changed(self, key: str) -> None:
        """Something persisted of `key` changed (`SchedulerJob.signature`), or the job came or
        went: `take_changed` names it."""
        self._changed.add(key)

    def take_changed(self) -> set[str]:
        """The jobs changed, admitted or ended since the last call (since the machine was made,
        for the first): a driver that persists jobs saves these and no others."""
        changed, self._changed = self._changed, set()
        return changed

    def reside(self, job: SchedulerJob, stay: Stay) -> None:
        """Record a residency of `job` (the only way one is added or replaced)."""
        self.index.resided(job.key, job.stays.get(stay.node_id), stay)
        job.stays[stay.node_id] = stay
        self.touch(job.key)

    def unreside(self, job: SchedulerJob, node_id: str) -> Stay | None:
        """Drop `job`'s residency on `node_id` (the only way one is removed); what it was."""
        stay = job.stays.pop(node_id, None)
        if stay is not None:
            self.index.resided(job.key, stay, None)
            self.touch(job.key)
        return stay

    def suspend(self, job: SchedulerJob, stay: Stay) -> None:
        """`job`'s residency `stay` is told to stop: it holds no GPUs from now on (the only way
        a residency lets its GPUs go while it lasts)."""
        if stay.holds_gpus:
            self.index.hold(stay.node_id, -len(stay.gpu_indices))
        stay.phase = Phase.SUSPENDING
        self.touch(job.key)

    def park(self, job: SchedulerJob, where: tuple[str, tuple[int, ...]] | None) -> None:
        """Hold `job` as parked in place `where` (node, GPU indices), or nowhere (the only way
        `SchedulerJob.parked` is set)."""
        was = None if job.parked is None else job.parked[0]
        self.index.parked(job.key, was, None if where is None else where[0])
        job.parked = where
        self.touch(job.key)

    def repass(self, ran: list[RunnableJob]) -> None:
        """The booking of a quantum advanced the passes of the jobs that ran (`ran`: their
        states booked, copies of the index's): the jobs take them (a job's pass is its own,
        `SchedulerJob.stride_pass`), and the index the states in their new places."""
        jobs = self.jobs
        for state in ran:
            jobs[state.id].stride_pass = state.pass_
            self._changed.add(state.id)
        self.index.min_pass.clear()
        self.index.queues.repass(ran)

    def saved(self) -> Saved:
        """What a driver persists (module doc); shares the machine's records, read it at once."""
        return Saved(
            usage_since=self.meter.since,
            quantum=self.quantum,
            last_tick_at=self.meter.last_tick_at,
            seq=self.seq,
            users=self.users,
            profiles=self.profiles,
            nodes=tuple(self.nodes.values()),
            jobs=self.jobs,
            usage=self.meter.seconds,
            entitlements=self.entitlements,
            entitlements_revision=self.entitlements_revision,
        )
