"""The profiler service: progress and switch reports in, `ProfileUpdated` and
`SwitchCostsUpdated` out, `gfair_profiles` kept.

Consumers:
- ``profiler-jobs`` (GFAIR_JOBS): accepted (a job's type and GPUs), progress (a measurement;
  a new process's first one also measures its cold start), suspended and resumed (what the
  job's switches take), completed / failed / cancelled (forget the job's own measurements);
- ``profiler-nodes`` (GFAIR_NODES): registrations (the generations the cluster offers).

Every handled event is idempotent: a progress report is folded only if it is past the last one
folded for its job, a switch report only if its id is not among the last ones folded for its
job, and a redelivery of the last one writes the same records and publishes the same profiles
and costs again (same derived ids, so JetStream keeps one copy). The job record is written
last: it is the commit point, so a crash before it folds the report again on redelivery (at
worst one sample counts twice in the user's running mean).

Records are written behind (`WriteBehind`): sent in order as events are handled and awaited
when their batch settles, before the inputs are acknowledged, so a batch costs one round trip.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog
from pydantic import BaseModel

from gfair.bus.key_value import KeyValue
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.service import Emit, Service
from gfair.bus.write_behind import WriteBehind
from gfair.events.envelope import Envelope
from gfair.events.jobs import (
    JobAccepted,
    JobCancelled,
    JobCompleted,
    JobFailed,
    JobProgress,
    JobResumed,
    JobSuspended,
)
from gfair.events.nodes import NodeRegistered
from gfair.state.buckets import PROFILES
from gfair.state.profile_record import (
    GENERATIONS_KEY,
    GenerationsRecord,
    JobProfileRecord,
    TypeProfileRecord,
    job_profile_key,
    type_profile_key,
)
from gfair_services.profiler.profile_book import Fold, ProfileBook
from gfair_services.profiler.seed import seed_table
from gfair_services.profiler.settings import ProfilerSettings
from gfair_services.skeleton import Consumes, declare, started

SERVICE_NAME = "profiler"

_log = structlog.get_logger("gfair.services.profiler")

JobEventData = (
    JobAccepted | JobProgress | JobSuspended | JobResumed | JobCompleted | JobFailed | JobCancelled
)


def _encode(record: BaseModel) -> bytes:
    return record.model_dump_json().encode()


class Profiler:
    def __init__(self, book: ProfileBook) -> None:
        self.book = book
        self._kv: KeyValue | None = None
        self.writes = WriteBehind()

    @property
    def kv(self) -> KeyValue:
        return started(self._kv, "the profiler (its bucket)")

    async def start(self, runtime: ServiceRuntime) -> None:
        """Restore the book from the bucket before any handler runs (docs/design.md §3.3)."""
        self._kv = await runtime.key_value(PROFILES.name)
        types: list[TypeProfileRecord] = []
        jobs: list[JobProfileRecord] = []
        generations = GenerationsRecord()
        for key in await self.kv.keys():
            entry = await self.kv.get(key)
            if entry is None:
                continue
            if key == GENERATIONS_KEY:
                generations = GenerationsRecord.model_validate_json(entry.value)
            elif key.startswith("type."):
                types.append(TypeProfileRecord.model_validate_json(entry.value))
            elif key.startswith("job."):
                jobs.append(JobProfileRecord.model_validate_json(entry.value))
        self.book.restore(types, jobs, generations.generations, generations.cause_id)
        _log.info(
            "profiles restored",
            type_profiles=len(types),
            jobs=len(jobs),
            generations=list(generations.generations),
        )

    async def on_job_event(self, envelope: Envelope, data: JobEventData) -> Sequence[Emit]:
        if isinstance(data, JobProgress):
            return await self._on_progress(envelope, data)
        if isinstance(data, JobSuspended | JobResumed):
            return self._on_switch(envelope, data)
        if isinstance(data, JobAccepted):
            record = self.book.admit(
                data.user, data.job_id, data.job_type, data.gpus, envelope.time
            )
            if record is not None:
                self.writes.put(self.kv, job_profile_key(data.user, data.job_id), _encode(record))
            return []
        if self.book.forget(data.user, data.job_id):
            self.writes.delete(self.kv, job_profile_key(data.user, data.job_id))
        return []

    async def _on_progress(self, envelope: Envelope, data: JobProgress) -> Sequence[Emit]:
        fold = self.book.replay(data.user, data.job_id, envelope.id)
        if fold is None:
            # No span per report: several a slice per running job, and nearly every one only
            # moves a running mean; a profile or costs it publishes go out in the job's trace.
            fold = self.book.observe(data, envelope.id, envelope.time)
            if fold is None:
                return []
        return self._folded(fold)

    def _on_switch(self, envelope: Envelope, data: JobSuspended | JobResumed) -> Sequence[Emit]:
        fold = self.book.replay(data.user, data.job_id, envelope.id) or self.book.switched(
            data, envelope.id, envelope.time
        )
        return [] if fold is None else self._folded(fold)

    def _folded(self, fold: Fold) -> Sequence[Emit]:
        """Write what `fold` changed and publish what it published."""
        self._write(fold)
        for profile in fold.profiles:
            _log.info(
                "profile updated",
                user=profile.user,
                job_id=profile.job_id,
                job_type=profile.job_type,
                speedups=profile.speedups,
            )
        emits = [Emit(profile) for profile in fold.profiles]
        if fold.costs is not None:
            _log.info("switch costs updated", **fold.costs.model_dump(exclude_none=True))
            emits.append(Emit(fold.costs))
        return emits

    def _write(self, fold: Fold) -> None:
        if fold.kind is not None:
            key = type_profile_key(fold.kind.user, fold.kind.job_type)
            self.writes.put(self.kv, key, _encode(fold.kind))
        self.writes.put(self.kv, job_profile_key(fold.job.user, fold.job.job_id), _encode(fold.job))

    async def on_node_registered(self, envelope: Envelope, data: NodeRegistered) -> Sequence[Emit]:
        if self.book.generations_cause == envelope.id:
            outcome = self.book.republished(envelope.id)
        else:
            outcome = self.book.offer(data.generations, envelope.id, envelope.time)
            if self.book.generations_cause != envelope.id:
                return []  # nothing new
        for record in outcome.records:
            self.writes.put(
                self.kv, type_profile_key(record.user, record.job_type), _encode(record)
            )
        generations = GenerationsRecord(
            generations=tuple(sorted(self.book.generations)), cause_id=envelope.id
        )
        self.writes.put(self.kv, GENERATIONS_KEY, _encode(generations))
        _log.info(
            "generations offered",
            node_id=data.node_id,
            generations=sorted(data.generations),
            profiles_republished=len(outcome.profiles),
        )
        return [Emit(profile) for profile in outcome.profiles]


def build_service(settings: ProfilerSettings | None = None) -> Service:
    settings = settings or ProfilerSettings()
    book = ProfileBook(
        seed_table(settings.throughputs),
        alpha=settings.throughput_alpha,
        change=settings.profile_change,
    )
    profiler = Profiler(book)
    settle = profiler.writes.settle
    return declare(
        SERVICE_NAME,
        settings,
        start=profiler.start,
        consumes=(
            Consumes("jobs", profiler.on_job_event, settle=settle, untraced=(JobProgress,)),
            Consumes("nodes", profiler.on_node_registered, settle=settle),
        ),
    )
