"""The split-stride state machine: the jobs admitted and where they run, the servers, the users'
accounts; events in (`apply`), plans out (`tick`). See the package's docstring."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from gfair.core import accounts
from gfair.core.kernel import PoolState, Snapshot, UserState
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
from .plan import CHANGED, UNCHANGED, QuantumPlan, Reply, Starts, Stop, StopReason, TimedOut
from .queues import Queues
from .residency import Phase, SchedulerJob, Stay, Switches, duration, job_key
from .usage import Meter

_NO_STAYS: Mapping[str, Stay] = {}

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
        # What the users were last entitled from (`snapshot`), until users come or go.
        self.entitled_for: tuple[object, ...] | None = None
        self.nodes: dict[str, Node] = {}
        self._schedulable: list[Node] = []
        self._sizes: dict[str, int] = {}
        self._names: frozenset[str] = frozenset()  # the schedulable servers'
        self._held: dict[str, int] = {}  # node -> GPUs its stays hold
        self._gpus_schedulable = 0
        self._held_schedulable = 0  # GPUs held on schedulable servers
        self.pools: tuple[tuple[PoolState, ...], dict[str, int]] = ((), {})
        self._set_nodes(saved.nodes)
        self.jobs = saved.jobs
        # The kernel's job input, kept up to date (`queues`): every change to a job touches it.
        self.queues = Queues()
        # Jobs changed since `take_changed`, which a driver saves (a restored machine's jobs
        # are as saved).
        self._changed: set[str] = set()
        self.meter = Meter(
            config.quantum_s,
            config.usage_gap_s,
            saved.usage,
            saved.usage_since,
            saved.last_tick_at,
        )
        # Jobs the last quantum moved that wait for their old nodes to let go before they start
        # on their new servers, whose GPUs are promised to them meanwhile. In memory only: after
        # a restart the next quantum decides anew.
        self._held_back: set[str] = set()
        # Node -> the held-back jobs placed on it (`promised`, asked for every server a fill
        # tries: a pass over every held-back job each time was most of an admission's cost with
        # thousands of them), and each such job's servers there; kept as they change.
        self._promised_on: dict[str, dict[str, None]] = {}
        self._promised_by: dict[str, tuple[str, ...]] = {}
        # Node -> jobs prepared there (held to its GPUs in number, `preparing`).
        self.preparing: dict[str, set[str]] = {}
        # Jobs that may hold residencies (a superset: pruned as it is read), and each user's
        # jobs, so that what an admission reads costs what runs and what the user has, not
        # the whole cluster's backlog.
        self._residents: set[str] = {key for key, job in self.jobs.items() if job.stays}
        # (Each user's jobs in arrival order: its first is its earliest.)
        self._of_user: dict[str, dict[str, None]] = {}
        self._min_pass: dict[str, float] = {}  # a user's lowest job pass, until passes change
        # Each job's arrival position among the jobs (the order of `jobs`), and each user's
        # demand and largest gang, until its jobs change.
        self.positions: dict[str, int] = {}
        self._arrivals = 0
        self._gangs: dict[str, tuple[float, float]] = {}
        # And every user's (`demand`, `ceilings`), until jobs come or go.
        self._demand: dict[str, float] | None = None
        self._ceilings: dict[str, float] | None = None
        # Node -> job key -> its stay there, node -> jobs parked there, node -> GPUs its stays
        # hold: what a server's questions read (`holders`, `free_indices`, `parked_on`) costs
        # what is on it, and `free_gpus` a look per server. Kept by the only ways stays and
        # parkings change: `reside`, `unreside`, `suspend`, `park`, `_forget`.
        self._on_node: dict[str, dict[str, Stay]] = {}
        self._parked_at: dict[str, set[str]] = {}
        for key, job in self.jobs.items():
            self._of_user.setdefault(job.user, {})[key] = None
            self._arrive(key)
            for stay in job.stays.values():
                self._index(key, stay)
            if job.parked is not None:
                self._parked_at.setdefault(job.parked[0], set()).add(key)
            if preparing.waits_prepared(job):
                self.preparing.setdefault(job.servers[0], set()).add(key)

    # -- inputs -------------------------------------------------------------------------------

    def apply(self, event: Event) -> Reply:
        """Fold `event` in; what changed and what follows from it."""
        reply = self._apply(event)
        if self.journal is not None:
            self.journal(event, reply)
        return reply

    def tick(self, now: float, heard_until: float | None = None) -> QuantumPlan:
        """Decide the next quantum at `now` and book it; `heard_until` as `Tick`'s."""
        timed_out = self._time_limits(now)
        plan = turns.decide_quantum(self, now, now if heard_until is None else heard_until)
        if timed_out:
            plan = replace(plan, timed_out=timed_out)
        if self.journal is not None:
            self.journal(Tick(now, heard_until), plan)
        return plan

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
                mine = self._of_user.get(event.user, {})
                of_type = (k for k in mine if self.jobs[k].job_type == event.job_type)
                self.queues.profiled(event.user, event.job_type, of_type)
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
            self.entitled_for = None
        mine = self._of_user.setdefault(user, {})
        if user not in self._min_pass:
            passes = (self.jobs[k].stride_pass for k in mine)
            self._min_pass[user] = accounts.joining_pass(passes)
        job = SchedulerJob(
            user=user,
            job_id=event.job_id,
            gpus=event.gpus,
            weight=event.weight,
            job_type=event.job_type,
            seq=self.next_seq(),
            stride_pass=self._min_pass[user],
            attempt=event.attempt,
            array=event.array,
            array_limit=event.array_limit,
            prepare=event.prepare,
            costs=event.costs,
            launch=event.launch,
        )
        self.jobs[key] = job
        mine[key] = None
        self._arrive(key)
        self._jobs_changed(user, first_changed=False)  # (a user's first job is its earliest)
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
        for job in self.residents():
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
        mine = self._of_user.get(user, {})
        earliest = next(iter(mine), None) == key
        mine.pop(key, None)
        self._min_pass.pop(user, None)
        if job is None:
            return None
        self._forget(job)
        self.positions.pop(key, None)
        self.touch(key)
        if not mine:
            self.users.pop(user, None)
            self.entitled_for = None
            self._of_user.pop(user, None)
        self._jobs_changed(user, first_changed=earliest and bool(mine))
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
        self._set_nodes(nodes)
        for node in nodes:
            was = before.get(node.node_id)
            if node.health is NodeHealth.FAILED and was is not None and was.health != node.health:
                for key in list(self._on_node.get(node.node_id, {})):
                    self.unreside(self.jobs[key], node.node_id)  # its processes died with it
        return True

    def _set_nodes(self, nodes: tuple[Node, ...]) -> None:
        self.nodes = {node.node_id: node for node in nodes}
        self._generations = {node.node_id: node.generation for node in nodes}
        self._schedulable = sorted(
            (node for node in nodes if node.schedulable), key=lambda n: n.node_id
        )
        self.pools = snapshot.server_pools(self._schedulable)
        self._sizes = {node.node_id: node.gpus for node in nodes}
        self._names = frozenset(node.node_id for node in self._schedulable)
        self._gpus_schedulable = sum(node.gpus for node in self._schedulable)
        self._held_schedulable = sum(self._held.get(name, 0) for name in self._names)

    def passes_changed(self) -> None:
        """A booked quantum changed jobs' passes: users' lowest passes are found again."""
        self._min_pass.clear()

    def _arrive(self, key: str) -> None:
        self.positions[key] = self._arrivals
        self._arrivals += 1

    def _jobs_changed(self, user: str, *, first_changed: bool) -> None:
        """`user`'s jobs came or went (`first_changed`: its earliest one went, and it has
        others): its demand and largest gang are found again, and in the users' `demand` and
        `ceilings` (made anew, never changed in place: `entitled_for` holds the last) it takes
        its new values, or leaves, or comes last (its first job is the latest to arrive), or,
        when its place among the users may have changed, they are all found again."""
        self._gangs.pop(user, None)
        gang = self._gang(user) if self._of_user.get(user) else None
        if self._demand is not None:
            self._demand = None if first_changed else _with(self._demand, user, gang, 0)
        if self._ceilings is not None:
            self._ceilings = _with(self._ceilings, user, gang, 1)

    def _gang(self, user: str) -> tuple[float, float]:
        """`user`'s demand (`accounts.demand`) and largest gang (`accounts.ceiling`)."""
        found = self._gangs.get(user)
        if found is None:
            mine = [self.jobs[key] for key in self._of_user[user]]
            asked = accounts.demand((job.user, job.gpus, job.member) for job in mine)
            found = asked[user], accounts.ceiling(job.gpus for job in mine)
            self._gangs[user] = found
        return found

    def demand(self) -> dict[str, float]:
        """User -> GPUs its admitted, unfinished jobs ask (`accounts.demand`), the users in the
        order of their earliest job's arrival (the machine's own until jobs come or go: read
        it, never change it)."""
        if self._demand is None:
            first = sorted(
                (self.positions[next(iter(keys))], user)
                for user, keys in self._of_user.items()
                if keys
            )
            self._demand = {user: self._gang(user)[0] for _, user in first}
        return self._demand

    def ceilings(self) -> dict[str, float]:
        """User -> what its credit may save up for (`accounts.ceiling`: its largest gang; the
        machine's own until jobs come or go)."""
        if self._ceilings is None:
            self._ceilings = {
                user: self._gang(user)[1] for user, keys in self._of_user.items() if keys
            }
        return self._ceilings

    # -- queries ------------------------------------------------------------------------------

    def snapshot(self, now: float) -> Snapshot:
        """What the kernel would decide from at `now` (`snapshot`; it refreshes entitlements),
        its job queues copied: the machine's own change as inputs arrive."""
        view = snapshot.snapshot(self, now)
        return replace(view, jobs={user: tuple(queue) for user, queue in view.jobs.items()})

    @property
    def last_tick_at(self) -> float | None:
        return self.meter.last_tick_at

    @property
    def usage(self) -> dict[str, dict[str, float]]:
        """GPU-seconds per user per pool since `meter.since`."""
        return self.meter.seconds

    @property
    def overrun(self) -> dict[str, dict[str, float]]:
        return self.meter.overrun

    @property
    def unheld(self) -> dict[str, dict[str, float]]:
        return self.meter.unheld

    def job(self, user: str, job_id: str) -> SchedulerJob | None:
        return self.jobs.get(job_key(user, job_id))

    def schedulable(self) -> list[Node]:
        """The servers jobs run on, by name."""
        return self._schedulable

    def sizes(self) -> dict[str, int]:
        """Server -> its GPUs (the machine's own: read it, never change it)."""
        return self._sizes

    def generations(self) -> dict[str, str]:
        """Server -> its pool, for every server known (the machine's own: read it, never
        change it)."""
        return self._generations

    def names(self) -> frozenset[str]:
        """The names of the servers jobs run on."""
        return self._names

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

    def touch(self, key: str) -> None:
        """Something `key`'s kernel state is made of changed (or the job came or went): its
        state is made again (`Queues.touch`), and the job is saved again (`changed`)."""
        self.queues.touch(key)
        self._changed.add(key)
        if key in self._held_back:
            self._promise(key)  # its servers may have changed, or it went

    @property
    def held_back(self) -> set[str]:
        """Jobs the last quantum moved that wait for their old nodes to let go (read it; it
        changes through its setter and `let_go` alone)."""
        return self._held_back

    @held_back.setter
    def held_back(self, keys: set[str]) -> None:
        self._held_back = keys
        self._promised_on, self._promised_by = {}, {}
        for key in keys:
            self._promise(key)

    def let_go(self, key: str) -> None:
        """`key` waits no more: the GPUs promised to it are free to others."""
        self._held_back.discard(key)
        self._promise(key)

    def _promise(self, key: str) -> None:
        """Promise `key`'s servers to it while it is held back, and no others."""
        for server in self._promised_by.pop(key, ()):
            promised = self._promised_on[server]
            del promised[key]
            if not promised:
                del self._promised_on[server]
        job = self.jobs.get(key)
        if key in self._held_back and job is not None and job.servers:
            self._promised_by[key] = job.servers
            for server in job.servers:
                self._promised_on.setdefault(server, {})[key] = None

    def changed(self, key: str) -> None:
        """Something persisted of `key` changed (`SchedulerJob.signature`), or the job came or went:
        `take_changed` names it."""
        self._changed.add(key)

    def take_changed(self) -> set[str]:
        """The jobs changed, admitted or ended since the last call (since the machine was made,
        for the first): a driver that persists jobs saves these and no others."""
        changed, self._changed = self._changed, set()
        return changed

    def reside(self, job: SchedulerJob, stay: Stay) -> None:
        """Record a residency of `job` (the only way one is added or replaced)."""
        key = job.key
        old = job.stays.get(stay.node_id)
        if old is not None:
            self._unindex(key, old)
        job.stays[stay.node_id] = stay
        self._residents.add(key)
        self._index(key, stay)
        self.touch(key)

    def unreside(self, job: SchedulerJob, node_id: str) -> Stay | None:
        """Drop `job`'s residency on `node_id` (the only way one is removed); what it was."""
        stay = job.stays.pop(node_id, None)
        if stay is not None:
            key = job.key
            self._unindex(key, stay)
            self.touch(key)
        return stay

    def suspend(self, job: SchedulerJob, stay: Stay) -> None:
        """`job`'s residency `stay` is told to stop: it holds no GPUs from now on (the only way
        a residency lets its GPUs go while it lasts)."""
        if stay.holds_gpus:
            self._hold(stay.node_id, -len(stay.gpu_indices))
        stay.phase = Phase.SUSPENDING
        self.touch(job.key)

    def _index(self, key: str, stay: Stay) -> None:
        node_id = stay.node_id
        here = self._on_node.get(node_id)
        if here is None:
            here = self._on_node[node_id] = {}
        here[key] = stay
        if stay.holds_gpus:
            self._hold(node_id, len(stay.gpu_indices))

    def _unindex(self, key: str, stay: Stay) -> None:
        node_id = stay.node_id
        here = self._on_node[node_id]
        del here[key]
        if not here:
            del self._on_node[node_id]
        if stay.holds_gpus:
            self._hold(node_id, -len(stay.gpu_indices))

    def _hold(self, node_id: str, gpus: int) -> None:
        self._held[node_id] = self._held.get(node_id, 0) + gpus
        if node_id in self._names:
            self._held_schedulable += gpus

    def park(self, job: SchedulerJob, where: tuple[str, tuple[int, ...]] | None) -> None:
        """Hold `job` as parked in place `where` (node, GPU indices), or nowhere (the only way
        `SchedulerJob.parked` is set)."""
        if job.parked is not None:
            self._parked_at[job.parked[0]].discard(job.key)
        job.parked = where
        if where is not None:
            self._parked_at.setdefault(where[0], set()).add(job.key)
        self.touch(job.key)

    def _forget(self, job: SchedulerJob) -> None:
        """Take an ended job out of the node indexes (its stays stay on it, to be killed)."""
        for stay in job.stays.values():
            self._unindex(job.key, stay)
        if job.parked is not None:
            self._parked_at[job.parked[0]].discard(job.key)

    def stays_within(self, names: frozenset[str]) -> bool:
        """Whether every residency is on one of the servers `names`."""
        return all(node_id in names for node_id in self._on_node)

    def residents(self) -> list[SchedulerJob]:
        """The jobs with residencies."""
        found: list[SchedulerJob] = []
        for key in list(self._residents):
            job = self.jobs.get(key)
            if job is None or not job.stays:
                self._residents.discard(key)
            else:
                found.append(job)
        return found

    def stays_on(self, node_id: str) -> Mapping[str, Stay]:
        """Job key -> its residency on `node_id`, for every job resident there (the machine's
        own: read it, never change it)."""
        return self._on_node.get(node_id, _NO_STAYS)

    def holding(self) -> dict[str, list[str]]:
        """Server -> the jobs holding GPUs there, for the servers where any does."""
        found: dict[str, list[str]] = {}
        for node_id, here in self._on_node.items():
            keys = [key for key, stay in here.items() if stay.holds_gpus]
            if keys:
                found[node_id] = keys
        return found

    def holders(self, node_id: str) -> dict[str, Stay]:
        """Job key -> its residency on `node_id`, for jobs holding GPUs there."""
        here = self._on_node.get(node_id)
        if not here:
            return {}
        return {key: stay for key, stay in here.items() if stay.holds_gpus}

    def free_indices(self, node_id: str) -> list[int]:
        node = self.nodes.get(node_id)
        if node is None:
            return []
        here = self._on_node.get(node_id)
        if not here:
            return list(node.gpu_indices)
        held = [i for stay in here.values() if stay.holds_gpus for i in stay.gpu_indices]
        return [i for i in node.gpu_indices if i not in held]

    def parked_on(self, node_id: str) -> dict[str, tuple[int, ...]]:
        """Job key -> GPU indices, for the jobs parked in place on `node_id` that hold no GPUs
        now."""
        found: dict[str, tuple[int, ...]] = {}
        for key in self._parked_at.get(node_id, ()):
            job = self.jobs[key]
            if not job.stays and job.parked is not None:
                found[key] = job.parked[1]
        return found

    def promised(self, node_id: str, sizes: dict[str, int]) -> int:
        """GPUs of `node_id` promised to held-back jobs."""
        jobs = self.jobs
        return sum(jobs[key].gpus_on(node_id, sizes) for key in self._promised_on.get(node_id, ()))

    def free_gpus(self) -> int:
        """GPUs of the schedulable servers that no job holds."""
        return self._gpus_schedulable - self._held_schedulable

    def held(self) -> dict[str, dict[str, float]]:
        """GPUs each user holds per pool now (its received share)."""
        held: dict[str, dict[str, float]] = {}
        for job in self.jobs.values():
            gpus = sum(len(s.gpu_indices) for s in job.stays.values() if s.holds_gpus)
            if gpus and job.generation is not None:
                pools = held.setdefault(job.user, {})
                pools[job.generation] = pools.get(job.generation, 0.0) + gpus
        return held

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


def _with(
    kept: dict[str, float], user: str, gang: tuple[float, float] | None, part: int
) -> dict[str, float]:
    """A copy of `kept` (user -> a part of its gang: `SplitStride.demand`, `ceilings`) with
    `user`'s part of `gang`, or without `user` (None: it has no jobs left)."""
    found = dict(kept)
    if gang is None:
        found.pop(user, None)
    else:
        found[user] = gang[part]
    return found
