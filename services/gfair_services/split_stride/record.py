"""Split-stride's state machine (`gfair.core.scheduler`) to and from the `StrideRecord` kept in
`gfair_stride`: times in seconds since the epoch in the machine, aware datetimes in the record;
the node inventory and the ids of the events applied, which the machine does not hold, beside.

A record holds every job: `Records` builds a job's part again only when the machine says it
changed since the last record (`SplitStride.take_changed`), and a profile's when its rates
changed, and keeps the same object otherwise, so that a write
(`gfair.state.stride_record.save_stride`) stores what changed, not the whole cluster, and
finds it without a look at every job (`Records.changed_jobs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from datetime import UTC, datetime

from gfair.core.kernel import UserState
from gfair.core.scheduler import Launch, Node, Phase, Saved, SchedulerJob, SplitStride, Stay
from gfair.core.scheduler.residency import Switches
from gfair.core.switch_costs import MeasuredSwitches
from gfair.events.jobs import JobLaunch
from gfair.state.profile_record import type_key
from gfair.state.stride_record import (
    ParkedPlace,
    Residency,
    ResidencyPhase,
    ServerRecord,
    StrideJob,
    StrideRecord,
    StrideUser,
    SwitchMeasurements,
    TypeProfile,
)
from gfair_services.inventory import NodeEntry, NodeInventory


def seconds(at: datetime) -> float:
    return at.timestamp()


def moment(at: float) -> datetime:
    return datetime.fromtimestamp(at, UTC)


def nodes(inventory: NodeInventory) -> tuple[Node, ...]:
    return tuple(entry.node() for entry in inventory.nodes.values())


def inventory(record: StrideRecord) -> NodeInventory:
    return NodeInventory(_entry(s) for s in record.servers.values())


def saved(record: StrideRecord) -> Saved:
    """What the machine is restored from."""
    return Saved(
        usage_since=seconds(record.usage_since),
        quantum=record.quantum,
        last_tick_at=None if record.last_tick_at is None else seconds(record.last_tick_at),
        seq=record.seq,
        users={
            name: UserState(name, user.seq, credit=dict(user.credit))
            for name, user in record.users.items()
        },
        profiles={
            user: {profile.job_type: dict(profile.rates) for profile in types.values()}
            for user, types in record.profiles.items()
        },
        nodes=nodes(inventory(record)),
        jobs={key: _job(j) for key, j in record.jobs.items()},
        usage={u: dict(p) for u, p in record.usage.items()},
        entitlements={u: dict(p) for u, p in record.entitlements.items()},
        entitlements_revision=record.entitlements_revision,
    )


class Records:
    """The records of one machine, from when it was made (restored) on: make a new one with
    every new machine, since the first record builds every job's part and later ones only
    those of the jobs the machine changed since."""

    def __init__(self) -> None:
        # Every job's part as last built; None until the first record.
        self._jobs: dict[str, StrideJob] | None = None
        # The jobs whose parts were built again since the last write (`stored`); None: every
        # one (no write since this machine was made).
        self._unstored: set[str] | None = None
        self._profiles: dict[
            tuple[str, str | None], tuple[Mapping[str, float], tuple[str, TypeProfile]]
        ] = {}
        # The servers' parts as last built, and the inventory's entries they were built from
        # (an entry is replaced, never changed): the same dict while they are the same, which a
        # write then passes over at once.
        self._entries: list[NodeEntry] = []
        self._servers: dict[str, ServerRecord] = {}
        self._users: dict[str, StrideUser] = {}

    @property
    def changed_jobs(self) -> Collection[str] | None:
        """The jobs the last `record` may hold otherwise than the last one written (`stored`;
        None: any): the only ones its write has to look at."""
        return self._unstored

    def stored(self) -> None:
        """The last `record` was written: later ones are told apart from it."""
        self._unstored = set()

    def record(
        self,
        machine: SplitStride,
        servers: NodeInventory,
        epoch: str,
        applied: Iterable[str],
        now: datetime,
    ) -> StrideRecord:
        state = machine.saved()
        changed = machine.take_changed()
        if self._jobs is None:
            self._jobs = {key: _record(job) for key, job in state.jobs.items()}
        else:
            for key in changed:
                job = state.jobs.get(key)
                if job is None:
                    self._jobs.pop(key, None)
                else:
                    self._jobs[key] = _record(job)
            if self._unstored is not None:
                self._unstored |= changed
        # Built without validation: every part is a record already (validated as it was
        # made), and validating them all again cost each batch's write a look at every job.
        return StrideRecord.model_construct(
            epoch=epoch,
            quantum=state.quantum,
            last_tick_at=None if state.last_tick_at is None else moment(state.last_tick_at),
            seq=state.seq,
            users={name: self._user(name, user) for name, user in state.users.items()},
            profiles={
                user: dict(
                    self._profile_record(user, job_type, rates) for job_type, rates in types.items()
                )
                for user, types in state.profiles.items()
            },
            servers=self._server_records(servers),
            # A dict of its own: the write compares it with the one it wrote last.
            jobs=dict(self._jobs),
            # Copies: the machine goes on changing its own.
            usage={user: dict(pools) for user, pools in state.usage.items()},
            usage_since=moment(state.usage_since),
            entitlements={user: dict(pools) for user, pools in state.entitlements.items()},
            entitlements_revision=state.entitlements_revision,
            applied_event_ids=tuple(applied),
            updated_at=now,
        )

    def _user(self, name: str, user: UserState) -> StrideUser:
        cached = self._users.get(name)
        if cached is None or cached.seq != user.seq or cached.credit != user.credit:
            cached = self._users[name] = StrideUser(seq=user.seq, credit=user.credit)
        return cached

    def _server_records(self, servers: NodeInventory) -> dict[str, ServerRecord]:
        entries = list(servers.nodes.values())
        if entries != self._entries:  # compares by identity first, in C
            self._entries = entries
            made = self._servers
            self._servers = {
                e.node_id: made[e.node_id]
                if e.node_id in made and _entry(made[e.node_id]) == e
                else _server_record(e)
                for e in entries
            }
        return self._servers

    def _profile_record(
        self, user: str, job_type: str | None, rates: Mapping[str, float]
    ) -> tuple[str, TypeProfile]:
        # The machine replaces a profile's rates when they change: the same rates object is
        # the same record (its key a digest, not worth working out again at every write).
        cached = self._profiles.get((user, job_type))
        if cached is not None and cached[0] is rates:
            return cached[1]
        made = type_key(job_type), TypeProfile(job_type=job_type, rates=rates)
        self._profiles[(user, job_type)] = (rates, made)
        return made


def _stay(record: Residency) -> Stay:
    return Stay(
        record.node_id,
        Phase(record.phase.value),
        record.attempt,
        record.gpu_indices,
        seconds(record.since),
        record.quantum,
        record.pending_suspends,
        record.unconfirmed,
    )


def _residency(stay: Stay) -> Residency:
    return Residency(
        node_id=stay.node_id,
        phase=ResidencyPhase(stay.phase.value),
        attempt=stay.attempt,
        gpu_indices=stay.gpu_indices,
        since=moment(stay.since),
        quantum=stay.quantum,
        pending_suspends=stay.pending_suspends,
        unconfirmed=stay.unconfirmed,
    )


def _server_record(entry: NodeEntry) -> ServerRecord:
    return ServerRecord(
        node_id=entry.node_id,
        generation=entry.generation,
        gpu_indices=entry.gpu_indices,
        state=entry.state,
        changed_at=entry.changed_at,
        hostname=entry.hostname,
    )


def _entry(record: ServerRecord) -> NodeEntry:
    return NodeEntry(
        record.node_id,
        record.generation,
        record.gpu_indices,
        record.state,
        record.changed_at,
        record.hostname,
    )


# What a job's record holds as the machine's `SchedulerJob` does, field for field: derived, so
# a per-job input added to both is stored without a line here. The rest is converted below.
_CONVERTED = frozenset({"runnable_at", "parked", "coming_up_until", "launch", "switches"})
_AS_IS = tuple(
    f.name
    for f in dataclasses.fields(SchedulerJob)
    if f.name in StrideJob.model_fields and f.name not in _CONVERTED
)


def _job(record: StrideJob) -> SchedulerJob:
    switches = record.switches
    return SchedulerJob(
        **{name: getattr(record, name) for name in _AS_IS},
        runnable_at=None if record.runnable_at is None else seconds(record.runnable_at),
        stays={r.node_id: _stay(r) for r in record.residency},
        parked=None
        if record.parked is None
        else (record.parked.node_id, record.parked.gpu_indices),
        coming_up_until=None if record.coming_up_until is None else seconds(record.coming_up_until),
        launch=None
        if record.launch is None
        else launch(record.launch, record.correlation_id, record.trace_parent),
        switches=None
        if switches is None
        else Switches(
            switches.reports,
            MeasuredSwitches(switches.yield_s, switches.resume_in_place_s, switches.cold_start_s),
        ),
    )


def _record(job: SchedulerJob) -> StrideJob:
    switches = job.switches
    return StrideJob(
        **{name: getattr(job, name) for name in _AS_IS},
        runnable_at=None if job.runnable_at is None else moment(job.runnable_at),
        residency=tuple(_residency(s) for s in job.stays.values()),
        parked=None
        if job.parked is None
        else ParkedPlace(node_id=job.parked[0], gpu_indices=job.parked[1]),
        coming_up_until=None if job.coming_up_until is None else moment(job.coming_up_until),
        launch=None if job.launch is None else JobLaunch.from_fields(job.launch),
        correlation_id=None if job.launch is None else job.launch.correlation_id,
        trace_parent=None if job.launch is None else job.launch.trace_parent,
        switches=None
        if switches is None
        else SwitchMeasurements(
            reports=switches.reports,
            yield_s=switches.measured.yield_s,
            resume_in_place_s=switches.measured.resume_in_place_s,
            cold_start_s=switches.measured.cold_start_s,
        ),
    )


def launch(of: JobLaunch, correlation_id: str | None, trace_parent: str | None) -> Launch:
    """The core's `Launch` of an event's or a record's `JobLaunch`, and the job's ids: made
    here only (the core may not know the event models)."""
    return Launch(**dict(of), correlation_id=correlation_id, trace_parent=trace_parent)
