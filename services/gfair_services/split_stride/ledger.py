"""Split-stride's state: the servers, the admitted jobs and where they run, the users' accounts.

The `Ledger` folds the events split-stride consumes and builds, each quantum, the snapshot the
decision kernel (`gfair.core.kernel`) decides from: the schedulable servers grouped into pools,
each active user's entitlement and credit per pool (`gfair.core.accounts`), and the runnable jobs
with their speeds (`ThroughputEstimator.gang_speeds`, the seed table refined by the profiles the
profiler publishes), passes, where they ran, and what a resume and a move cost them (`costs`:
the switches the profiler measured, `SwitchCostsUpdated`; the operator's settings until then,
and the operator's move cost as a floor). A job may run when:

- its process has not exited awaiting the failure detector's verdict, and a retry's delay is over;
- it holds no residency outside the servers the kernel last placed it on: a job the kernel moved
  starts on its new servers only once its old node confirmed it let go (checkpoint written), so
  it never runs twice;
- it is among the members its job array's limit lets run (`gfair.core.arrays.limit_arrays`).

Jobs held for their dependencies never reach the ledger: placement announces a job as accepted
only once it may run (`gfair.core.dependencies`).

Entitlements are what the trading auction last published (`EntitlementsUpdated`) when that
covers every user with jobs; otherwise the no-trading shares (`pools.shares`) of the users'
tickets and demand (the GPUs of their admitted, unfinished jobs, less what arrays ask beyond
their limits). The ledger converts to and from the `StrideRecord` kept in `gfair_stride`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from operator import attrgetter

import structlog

from gfair.core import accounts, arrays, kernel, pools
from gfair.core.cluster import generation_rank
from gfair.core.kernel import Decision, JobState, PoolState, Snapshot, UserState
from gfair.core.switch_costs import MeasuredSwitches, SwitchCosts
from gfair.core.throughput import ThroughputEstimator
from gfair.events.envelope import Envelope
from gfair.events.jobs import (
    JobExited,
    JobMigrated,
    JobResumed,
    JobRetried,
    JobStarted,
    JobSuspended,
)
from gfair.events.nodes import NodeEvent
from gfair.events.scheduling import EntitlementsUpdated, ProfileUpdated, SwitchCostsUpdated
from gfair.events.states import NodeState
from gfair.state.buckets import job_key
from gfair.state.profile_record import type_key
from gfair.state.stride_record import (
    MAX_APPLIED_IDS,
    Phase,
    Residency,
    ServerRecord,
    StrideJob,
    StrideRecord,
    StrideUser,
    SwitchMeasurements,
    TypeProfile,
)
from gfair_services.inventory import NodeEntry, NodeInventory

from .settings import Settings

_log = structlog.get_logger("gfair.split_stride")


@dataclass
class Stay:
    """A residency (see `gfair.state.stride_record`): where the job was told to run."""

    node_id: str
    phase: Phase
    attempt: int
    gpu_indices: tuple[int, ...]
    since: datetime
    quantum: int
    pending_suspends: int = 0
    # Stopped while its start was still unconfirmed. The node processes commands in order, so
    # if it ran the start, `started` comes before any answer to the stop; if it refused the
    # start (its start guard saw the job re-placed meanwhile) nothing comes at all, not even
    # for the stop. Such a stop is forgotten after `unconfirmed_release_s`, not the long
    # `release_timeout_s`; kept in the record, so a reload after a failed write (a broker
    # lost) does not hold the job back for the long timeout.
    unconfirmed: bool = False

    @property
    def holds_gpus(self) -> bool:
        return self.phase.holds_gpus

    @classmethod
    def of(cls, record: Residency) -> Stay:
        return cls(*_stay_values(record))

    def values(self) -> tuple[object, ...]:
        return _stay_values(self)

    def record(self) -> Residency:
        return Residency(**dict(zip(_STAY_FIELDS, _stay_values(self), strict=True)))


# A stay is persisted as a `Residency` of the same fields.
_STAY_FIELDS = tuple(f.name for f in fields(Stay))
_stay_values = attrgetter(*_STAY_FIELDS)


@dataclass
class Job:
    user: str
    job_id: str
    gpus: int
    weight: float
    job_type: str | None
    seq: int  # arrival order
    stride_pass: float = 0.0
    generation: str | None = None
    servers: tuple[str, ...] = ()  # where the kernel last placed it
    attempt: int = 1
    runnable_at: datetime | None = None
    exited: bool = False
    stays: dict[str, Stay] = field(default_factory=dict)
    array: str | None = None  # its job array's id (the user's), if any
    array_limit: int | None = None
    switches: SwitchMeasurements | None = None  # as the profiler last measured them
    # The costs `Ledger.costs` last worked out, for these switches and parked or not: a
    # snapshot reads them for every runnable job every quantum.
    charged: tuple[SwitchMeasurements, bool, SwitchCosts] | None = field(
        default=None, compare=False
    )
    # Where its process is parked in place (its node said its last suspend was in place): the
    # node and GPU indices it resumes on without a checkpoint. Not persisted: a reloaded
    # split-stride merely loses the preference (the node then checkpoints it when it starts
    # elsewhere, and a start elsewhere waits for that).
    parked: tuple[str, tuple[int, ...]] | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        return job_key(self.user, self.job_id)

    @property
    def member(self) -> arrays.ArrayMember | None:
        if self.array is None:
            return None
        return arrays.ArrayMember(arrays.array_key(self.user, self.array), self.array_limit)

    def signature(self) -> tuple[object, ...]:
        """Everything persisted about the job, to tell whether it changed."""
        return (
            self.servers,
            self.generation,
            self.attempt,
            self.runnable_at,
            self.exited,
            self.stride_pass,
            tuple(s.values() for s in self.stays.values()),
            self.switches,
        )

    def gpus_on(self, server_id: str, sizes: dict[str, int]) -> int:
        """GPUs the gang uses on `server_id`: spread as evenly as the servers allow."""
        if len(self.servers) == 1:
            return self.gpus
        left = self.gpus
        order = sorted(self.servers, key=lambda s: (sizes.get(s, 0), self.servers.index(s)))
        for position, server in enumerate(order):
            share = min(sizes.get(server, 0), -(-left // (len(order) - position)))
            if server == server_id:
                return share
            left -= share
        return 0


class Ledger:
    def __init__(
        self, record: StrideRecord, settings: Settings, estimator: ThroughputEstimator
    ) -> None:
        self.settings = settings
        self.estimator = estimator
        # What the operator sets: a job's costs until measured, and a move's floor.
        self.operator_costs = SwitchCosts(
            resume_s=settings.resume_cost_s, migration_s=settings.migration_cost_s
        )
        self.epoch = record.epoch
        self.quantum = record.quantum
        self.last_tick_at = record.last_tick_at
        self.seq = record.seq
        self.users: dict[str, UserState] = {
            name: UserState(name, user.seq, credit=dict(user.credit))
            for name, user in record.users.items()
        }
        self.profiles: dict[str, dict[str, TypeProfile]] = {
            user: dict(types) for user, types in record.profiles.items()
        }
        for user, types in self.profiles.items():
            for profile in types.values():
                estimator.observe_profile(user, profile.job_type, profile.rates)
        self.usage: dict[str, dict[str, float]] = {u: dict(p) for u, p in record.usage.items()}
        self.usage_since = record.usage_since
        self.entitlements: dict[str, dict[str, float]] = {
            u: dict(p) for u, p in record.entitlements.items()
        }
        self.entitlements_revision = record.entitlements_revision
        self.inventory = NodeInventory(
            NodeEntry(s.node_id, s.generation, s.gpu_indices, s.state, s.changed_at, s.hostname)
            for s in record.servers.values()
        )
        self.jobs: dict[str, Job] = {key: _job(j) for key, j in record.jobs.items()}
        self._applied: deque[str] = deque(record.applied_event_ids, maxlen=MAX_APPLIED_IDS)
        self._records: dict[str, tuple[tuple[object, ...], StrideJob]] = {}
        # Jobs the last quantum moved that wait for their old nodes to let go before they start
        # on their new servers, whose GPUs are promised to them meanwhile. In memory only: after
        # a restart the next quantum decides anew.
        self.held_back: set[str] = set()
        # User -> pool -> GPU-seconds its jobs held after they were told to stop (from the
        # suspend until their node reported them off), charged at the next tick's settle
        # (`kernel.Snapshot.overrun`). In memory only: a restart forgets at most one tick's.
        self.overrun: dict[str, dict[str, float]] = {}
        # The jobs the last booked quantum charged (run on entitlement), and user -> pool ->
        # GPU-seconds of that charge not yet given back; `unheld` is what was: the seconds
        # from the tick to a charged job's start report, given back at the next tick's settle
        # (`kernel.Snapshot.unheld`). In memory only, as the overrun.
        self.charged_jobs: frozenset[str] = frozenset()
        self.refundable: dict[str, dict[str, float]] = {}
        self.unheld: dict[str, dict[str, float]] = {}
        # Jobs that may hold residencies (a superset: pruned as it is read), and each user's
        # jobs, so that what an admission reads costs what runs and what the user has, not
        # the whole cluster's backlog.
        self._residents: set[str] = {key for key, job in self.jobs.items() if job.stays}
        self._of_user: dict[str, set[str]] = {}
        self._min_pass: dict[str, float] = {}  # a user's lowest job pass, until passes change
        for key, job in self.jobs.items():
            self._of_user.setdefault(job.user, set()).add(key)

    # -- persistence ----------------------------------------------------------------------

    def to_record(self, now: datetime) -> StrideRecord:
        return StrideRecord(
            epoch=self.epoch,
            quantum=self.quantum,
            last_tick_at=self.last_tick_at,
            seq=self.seq,
            users={
                name: StrideUser(seq=user.seq, credit=user.credit)
                for name, user in self.users.items()
            },
            profiles=self.profiles,
            servers={
                e.node_id: ServerRecord(
                    node_id=e.node_id,
                    generation=e.generation,
                    gpu_indices=e.gpu_indices,
                    state=e.state,
                    changed_at=e.changed_at,
                    hostname=e.hostname,
                )
                for e in self.inventory.nodes.values()
            },
            jobs={key: self._job_record(key, job) for key, job in self.jobs.items()},
            usage=self.usage,
            usage_since=self.usage_since,
            entitlements=self.entitlements,
            entitlements_revision=self.entitlements_revision,
            applied_event_ids=tuple(self._applied),
            updated_at=now,
        )

    def _job_record(self, key: str, job: Job) -> StrideJob:
        # Most jobs did not change since the last write; building their records again would
        # make every write cost as much as the whole cluster.
        signature = job.signature()
        cached = self._records.get(key)
        if cached is not None and cached[0] == signature:
            return cached[1]
        record = _record(job)
        self._records[key] = (signature, record)
        return record

    def seen(self, event_id: str) -> bool:
        return event_id in self._applied

    def note(self, event_id: str) -> None:
        self._applied.append(event_id)

    # -- the kernel's snapshot and decision -------------------------------------------------

    def schedulable(self) -> list[NodeEntry]:
        return sorted(self.inventory.schedulable(), key=lambda e: e.node_id)

    def runnable(self, job: Job, now: datetime) -> bool:
        if job.exited:
            return False
        if job.runnable_at is not None and job.runnable_at > now:
            return False
        return all(node in job.servers for node in job.stays)

    def snapshot(self, now: datetime) -> Snapshot:
        """What the kernel decides this quantum from (module doc); users' entitlements are
        refreshed on the way."""
        servers: dict[str, list[NodeEntry]] = {}
        for entry in self.schedulable():
            servers.setdefault(entry.generation, []).append(entry)
        fastest_first = sorted(servers, key=generation_rank, reverse=True)
        pool_states = tuple(
            PoolState(g, tuple(e.server() for e in servers[g]), rank)
            for rank, g in enumerate(fastest_first)
        )
        pool_gpus = {g: sum(e.gpus for e in servers[g]) for g in reversed(fastest_first)}
        self._entitle(pool_gpus)
        speeds: dict[tuple[str, str | None, int], dict[str, float]] = {}
        queues: dict[str, list[JobState]] = {}
        members: dict[str, arrays.ArrayMember] = {}
        for key, job in self.jobs.items():
            if not self.runnable(job, now):
                continue
            if (member := job.member) is not None:
                members[key] = member
            shape = (job.user, job.job_type, job.gpus)
            if shape not in speeds:
                speeds[shape] = self.estimator.gang_speeds(
                    key, job.user, job.job_type, job.gpus, pool_gpus
                )
            running = tuple(
                node
                for node in job.servers
                if (stay := job.stays.get(node)) is not None
                and stay.holds_gpus
                and stay.attempt == job.attempt
            )
            costs = self.operator_costs if job.switches is None else self.costs(job)
            queues.setdefault(job.user, []).append(
                JobState(
                    key,
                    job.user,
                    job.gpus,
                    job.seq,
                    speeds[shape],
                    job.stride_pass,
                    job.weight,
                    running=running if len(running) == len(job.servers) else (),
                    home=job.servers,
                    move_s=costs.migration_s,
                    resume_s=costs.resume_s,
                )
            )
        for queue in queues.values():
            queue.sort(key=lambda state: (state.pass_, state.seq))
        overrun, unheld = (
            {
                user: {pool: held / self.settings.quantum_s for pool, held in pools.items()}
                for user, pools in seconds.items()
            }
            for seconds in (self.overrun, self.unheld)
        )
        jobs = arrays.limit_arrays(queues, members) if members else queues
        return Snapshot(pool_states, self.users, jobs, overrun, unheld, self.settings.quantum_s)

    def costs(self, job: Job) -> SwitchCosts:
        """What a resume and a move cost `job` (`MeasuredSwitches.charged`): its resume is in
        place while its process is parked on its node."""
        measured = job.switches
        if measured is None:
            return self.operator_costs
        parked = job.parked is not None
        cached = job.charged
        if cached is not None and cached[0] is measured and cached[1] == parked:
            return cached[2]
        costs = MeasuredSwitches(
            measured.yield_s, measured.resume_in_place_s, measured.cold_start_s
        ).charged(self.operator_costs, parked=parked)
        job.charged = (measured, parked, costs)
        return costs

    def _entitle(self, pool_gpus: dict[str, int]) -> None:
        demand = accounts.demand((job.user, job.gpus, job.member) for job in self.jobs.values())
        for user in sorted(demand.keys() - self.users.keys()):
            # A record written before accounts were kept: its users arrive now.
            self.users[user] = UserState(user, self._next_seq())
        published = self.entitlements if self.entitlements_revision >= 0 else {}
        if demand and all(user in published for user in demand):
            entitled: dict[str, dict[str, float]] = {
                user: {g: float(published[user].get(g, 0.0)) for g in pool_gpus} for user in demand
            }
        else:
            tickets = self.settings.tickets_map(demand)
            entitled = pools.shares(pool_gpus, tickets, demand, tree=self.settings.shares).entitled
        names = sorted(self.users)
        accounts.entitle([self.users[name] for name in names], entitled, pool_gpus)

    def settle(self, snapshot: Snapshot, decision: Decision) -> None:
        """Book the quantum into the users' credits and the passes of the jobs that ran."""
        ran = [
            state
            for jobs in snapshot.jobs.values()
            for state in jobs
            if state.id in decision.placed
        ]
        gangs: dict[str, list[int]] = {}
        for job in self.jobs.values():
            gangs.setdefault(job.user, []).append(job.gpus)
        ceiling = {user: accounts.ceiling(sizes) for user, sizes in gangs.items()}
        booked = kernel.settle(
            self.users, ran, decision, ceiling, snapshot.overrun, snapshot.unheld
        )
        self.overrun.clear()  # charged now (users gone meanwhile owe nothing)
        self.unheld.clear()
        self.charged_jobs = decision.entitled if booked else frozenset()
        quantum_s = self.settings.quantum_s
        self.refundable = (
            {
                user: {pool: gpus * quantum_s for pool, gpus in pools.items()}
                for user, pools in decision.charged.items()
            }
            if booked
            else {}
        )
        if booked:
            self._min_pass.clear()
            for state in ran:
                self.jobs[state.id].stride_pass = state.pass_

    def place(self, decision: Decision) -> list[Job]:
        """Take the decision's placements; the jobs placed on other servers than before."""
        pool_of = {entry.node_id: entry.generation for entry in self.schedulable()}
        moved: list[Job] = []
        for key, servers in decision.placed.items():
            job = self.jobs[key]
            if job.servers != servers:
                job.servers, job.generation = servers, pool_of[servers[0]]
                moved.append(job)
        return moved

    # -- jobs coming and going ------------------------------------------------------------------

    def admit(
        self,
        user: str,
        job_id: str,
        gpus: int,
        weight: float,
        job_type: str | None,
        attempt: int = 1,
        array: str | None = None,
        array_limit: int | None = None,
    ) -> Job:
        """A newly admitted job, and its user's account when it is the user's first."""
        if user not in self.users:
            self.users[user] = UserState(user, self._next_seq())
        mine = self._of_user.setdefault(user, set())
        if user not in self._min_pass:
            passes = (self.jobs[key].stride_pass for key in mine)
            self._min_pass[user] = accounts.joining_pass(passes)
        job = Job(
            user=user,
            job_id=job_id,
            gpus=gpus,
            weight=weight,
            job_type=job_type,
            seq=self._next_seq(),
            stride_pass=self._min_pass[user],
            attempt=attempt,
            array=array,
            array_limit=array_limit,
        )
        self.jobs[job.key] = job
        mine.add(job.key)
        return job

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def finished(self, user: str, job_id: str) -> Job | None:
        """Forget a job that ended for good; returns it (its residencies) or None. A user with
        no jobs left leaves with its account (it comes back as a newcomer)."""
        key = job_key(user, job_id)
        job = self.jobs.pop(key, None)
        mine = self._of_user.get(user, set())
        mine.discard(key)
        self._min_pass.pop(user, None)
        if job is not None and not mine:
            self.users.pop(user, None)
            self._of_user.pop(user, None)
        return job

    # -- GPUs held ----------------------------------------------------------------------------

    def reside(self, job: Job, stay: Stay) -> None:
        """Record a residency of `job` (the only way one is added)."""
        job.stays[stay.node_id] = stay
        self._residents.add(job.key)

    def residents(self) -> list[Job]:
        """The jobs with residencies."""
        found: list[Job] = []
        for key in list(self._residents):
            job = self.jobs.get(key)
            if job is None or not job.stays:
                self._residents.discard(key)
            else:
                found.append(job)
        return found

    def holders(self, node_id: str) -> dict[str, Stay]:
        """Job key -> its residency on `node_id`, for jobs holding GPUs there."""
        return {
            job.key: stay
            for job in self.residents()
            if (stay := job.stays.get(node_id)) is not None and stay.holds_gpus
        }

    def free_indices(self, node_id: str) -> list[int]:
        entry = self.inventory.get(node_id)
        if entry is None:
            return []
        held = {i for stay in self.holders(node_id).values() for i in stay.gpu_indices}
        return [i for i in entry.gpu_indices if i not in held]

    def pick_indices(
        self,
        job: Job,
        node_id: str,
        free: list[int],
        need: int,
        parked: Mapping[str, tuple[int, ...]],
    ) -> list[int]:
        """`need` of the `free` indices of `node_id` for `job`: the ones it is parked on there,
        when free (it then resumes in place, without a checkpoint); else preferably ones no
        other job is parked on (`parked`: `parked_on(node_id)`, looked up once per node by the
        caller); else the lowest."""
        if job.parked is not None and job.parked[0] == node_id:
            own = [i for i in job.parked[1] if i in free]
            if len(own) == need:
                return own
        reserved = {i for key, indices in parked.items() if key != job.key for i in indices}
        unclaimed = [i for i in free if i not in reserved]
        claimed = [i for i in free if i in reserved]
        return (unclaimed + claimed)[:need]

    def parked_on(self, node_id: str) -> dict[str, tuple[int, ...]]:
        """Job key -> GPU indices, for the jobs parked in place on `node_id` that hold no GPUs
        now."""
        return {
            job.key: job.parked[1]
            for job in self.jobs.values()
            if job.parked is not None and job.parked[0] == node_id and not job.stays
        }

    def promised(self, node_id: str, sizes: dict[str, int]) -> int:
        """GPUs of `node_id` promised to held-back jobs."""
        return sum(
            self.jobs[key].gpus_on(node_id, sizes)
            for key in self.held_back
            if key in self.jobs and node_id in self.jobs[key].servers
        )

    def free_gpus(self) -> int:
        """GPUs of the schedulable servers that no job holds (one pass over the jobs)."""
        names = {entry.node_id: entry.gpus for entry in self.schedulable()}
        held = sum(
            len(stay.gpu_indices)
            for job in self.residents()
            for stay in job.stays.values()
            if stay.holds_gpus and stay.node_id in names
        )
        return sum(names.values()) - held

    def sizes(self) -> dict[str, int]:
        return {node_id: e.gpus for node_id, e in self.inventory.nodes.items()}

    # -- folding events -----------------------------------------------------------------------

    def node_event(self, envelope: Envelope, event: NodeEvent) -> bool:
        change = self.inventory.apply(envelope, event)
        if change is None:
            return False
        if change.after is NodeState.FAILED:
            for job in self.jobs.values():
                job.stays.pop(change.node_id, None)  # its processes died with it
        return True

    def entitlements_event(self, event: EntitlementsUpdated) -> bool:
        if event.revision <= self.entitlements_revision:
            return False
        self.entitlements_revision = event.revision
        self.entitlements = {u: dict(p) for u, p in event.entitlements.items()}
        return True

    def profile_event(self, event: ProfileUpdated) -> bool:
        """A user's profile of a job type (per-job estimates refine little beyond it)."""
        if event.job_id is not None:
            return False
        types = self.profiles.setdefault(event.user, {})
        key = type_key(event.job_type)
        old = types.get(key)
        if old is not None and old.rates == event.rates:
            return False
        types[key] = TypeProfile(job_type=event.job_type, rates=event.rates)
        self.estimator.observe_profile(event.user, event.job_type, event.rates)
        return True

    def costs_event(self, event: SwitchCostsUpdated) -> bool:
        """A job's switches as the profiler measured them; an older estimate (fewer reports, a
        redelivery) than the one held changes nothing."""
        job = self.jobs.get(job_key(event.user, event.job_id))
        if job is None or (job.switches is not None and event.reports <= job.switches.reports):
            return False
        job.switches = SwitchMeasurements(
            reports=event.reports,
            yield_s=event.yield_s,
            resume_in_place_s=event.resume_in_place_s,
            cold_start_s=event.cold_start_s,
        )
        return True

    def confirmed(
        self, event: JobStarted | JobResumed, at: datetime, received: datetime | None = None
    ) -> bool:
        """The node started the job at `at` (received at `received`, by this service's clock,
        which bounds `at`: a node's clock ahead of it would give back seconds never lost)."""
        job = self.jobs.get(job_key(event.user, event.job_id))
        if job is None:
            return False
        node = self.inventory.get(event.node_id)
        if node is not None and node.state is NodeState.FAILED:
            return False  # reported before the node was declared dead; it died with it
        stay = job.stays.get(event.node_id)
        if stay is None:
            # A start split-stride does not remember asking for: track what really runs.
            self.reside(
                job,
                Stay(
                    event.node_id, Phase.RUNNING, event.attempt, event.gpu_indices, at, self.quantum
                ),
            )
            return True
        if job.parked is not None and job.parked[0] == event.node_id:
            job.parked = None  # resumed there, in place or not
        if stay.phase is Phase.STARTING and stay.attempt == event.attempt:
            stay.phase = Phase.RUNNING
            self._started_late(job, stay, min(at, received or at))
            return True
        if stay.attempt == event.attempt and stay.unconfirmed:
            stay.unconfirmed = False  # it did start: its stop will be confirmed in turn
            return True
        return False

    def released(
        self,
        event: JobSuspended | JobMigrated | JobExited,
        at: datetime,
        received: datetime | None = None,
    ) -> bool:
        """The node stopped the job at `at`: a suspend, a migration away, or the process
        ended. A stop's overrun runs to `received`, by this service's clock like the stop's
        own time (a node's clock ahead of it would charge phantom overruns)."""
        job = self.jobs.get(job_key(event.user, event.job_id))
        if job is None:
            return False
        node_id = event.from_node if isinstance(event, JobMigrated) else event.node_id
        changed = False
        stay = job.stays.get(node_id)
        if isinstance(event, JobSuspended) and event.in_place and stay is not None:
            job.parked = (node_id, stay.gpu_indices)
        elif job.parked is not None and job.parked[0] == node_id:
            job.parked = None  # its process there checkpointed and left, or ended
        if isinstance(event, JobExited) and event.attempt >= job.attempt:
            if stay is None and any(s.holds_gpus for s in job.stays.values()):
                # A copy left where the job no longer runs (its node was declared failed, and
                # the job started elsewhere): the failure detector ignores its end too, so
                # waiting for a verdict would hold the job forever.
                _log.info("exit of a copy elsewhere ignored", job=job.key, node_id=node_id)
                return False
            job.exited = True  # until the failure detector says what becomes of it
            changed = True
        if stay is None:
            return changed
        if isinstance(event, JobSuspended) and stay.pending_suspends > 0:
            stay.pending_suspends -= 1
            if stay.holds_gpus:
                return True  # an older suspend; the start sent after it is still in force
        if stay.holds_gpus:
            self._charge(job, stay, at)  # it ended mid-quantum: its part of the quantum
        else:
            self._overran(job, stay, received or at)  # held until now, told to stop or not
        del job.stays[node_id]
        return True

    def retried(self, event: JobRetried, at: datetime) -> bool:
        job = self.jobs.get(job_key(event.user, event.job_id))
        if job is None or event.attempt < job.attempt:
            return False
        job.attempt = event.attempt
        job.exited = False
        job.runnable_at = at + timedelta(seconds=event.delay_s) if event.delay_s > 0 else None
        return True

    # -- usage --------------------------------------------------------------------------------

    def account(self, now: datetime) -> None:
        """Charge the GPUs held since the last tick (or since they were taken, if later) to
        their users, per pool."""
        for job in self.residents():
            for stay in job.stays.values():
                if stay.holds_gpus:
                    self._charge(job, stay, now)
                else:
                    self._overran(job, stay, now)
        self.last_tick_at = now

    def _started_late(self, job: Job, stay: Stay, at: datetime) -> None:
        """The start was told at `stay.since` and confirmed at `at`: the job holds its GPUs from
        then on. If the last quantum charged it, the seconds since the tick it did not hold
        are given back to its user (at most what the quantum charged it there)."""
        stay.since = max(stay.since, at)
        if job.key not in self.charged_jobs or self.last_tick_at is None:
            return
        late = (stay.since - self.last_tick_at).total_seconds()
        pool = self._pool(job, stay)
        left = self.refundable.get(job.user, {})
        given = min(len(stay.gpu_indices) * min(late, self.settings.quantum_s), left.get(pool, 0))
        if given <= 0.0:
            return
        left[pool] -= given
        unheld = self.unheld.setdefault(job.user, {})
        unheld[pool] = unheld.get(pool, 0.0) + given

    def _pool(self, job: Job, stay: Stay) -> str:
        entry = self.inventory.get(stay.node_id)
        return entry.generation if entry is not None else job.generation or "unknown"

    def _charge(self, job: Job, stay: Stay, until: datetime) -> None:
        if stay.phase is Phase.STARTING:
            return  # it holds its GPUs from its start report on (`_started_late`)
        since = stay.since if self.last_tick_at is None else max(stay.since, self.last_tick_at)
        elapsed = max(0.0, min((until - since).total_seconds(), self.settings.usage_gap_s))
        pool = self._pool(job, stay)
        per_pool = self.usage.setdefault(job.user, {})
        per_pool[pool] = per_pool.get(pool, 0.0) + len(stay.gpu_indices) * elapsed

    def _overran(self, job: Job, stay: Stay, until: datetime) -> None:
        """A suspending stay's GPU time up to `until` (since its suspend, or the last tick):
        its node has not reported it off, so the job still holds those GPUs, whatever the
        decision said. A stop of a start never confirmed holds nothing: the node refused it,
        or its start report comes first and the stop's time counts from there."""
        if stay.unconfirmed:
            return
        since = stay.since if self.last_tick_at is None else max(stay.since, self.last_tick_at)
        elapsed = max(0.0, min((until - since).total_seconds(), self.settings.usage_gap_s))
        if elapsed <= 0.0:
            return
        held = len(stay.gpu_indices) * elapsed
        pool = self._pool(job, stay)
        per_pool = self.usage.setdefault(job.user, {})
        per_pool[pool] = per_pool.get(pool, 0.0) + held
        overrun = self.overrun.setdefault(job.user, {})
        overrun[pool] = overrun.get(pool, 0.0) + held

    def expire(self, now: datetime) -> list[tuple[str, Stay]]:
        """Drop starts and suspends no node confirmed in time; what was dropped."""
        limit = timedelta(seconds=self.settings.release_timeout_s)
        refused = timedelta(seconds=self.settings.unconfirmed_release_s)
        dropped: list[tuple[str, Stay]] = []
        for job in self.residents():
            for node_id, stay in list(job.stays.items()):
                if stay.phase is Phase.RUNNING:
                    continue
                wait = refused if stay.unconfirmed else limit
                if now - stay.since > wait:
                    del job.stays[node_id]
                    dropped.append((job.key, stay))
        return dropped


def _job(record: StrideJob) -> Job:
    return Job(
        user=record.user,
        job_id=record.job_id,
        gpus=record.gpus,
        weight=record.weight,
        job_type=record.job_type,
        seq=record.seq,
        stride_pass=record.stride_pass,
        generation=record.generation,
        servers=record.servers,
        attempt=record.attempt,
        runnable_at=record.runnable_at,
        exited=record.exited,
        stays={r.node_id: Stay.of(r) for r in record.residency},
        array=record.array,
        array_limit=record.array_limit,
        switches=record.switches,
    )


def _record(job: Job) -> StrideJob:
    return StrideJob(
        user=job.user,
        job_id=job.job_id,
        gpus=job.gpus,
        weight=job.weight,
        job_type=job.job_type,
        seq=job.seq,
        stride_pass=job.stride_pass,
        generation=job.generation,
        servers=job.servers,
        attempt=job.attempt,
        runnable_at=job.runnable_at,
        exited=job.exited,
        residency=tuple(s.record() for s in job.stays.values()),
        array=job.array,
        array_limit=job.array_limit,
        switches=job.switches,
    )
