"""The failure detector: node liveness and quarantine, and what each job exit means.

Consumers:
- ``failure-detector-nodes`` (GFAIR_NODES): registrations and heartbeats (liveness, inventory,
  recovery) and operators' ``uncordoned`` events (clear a quarantine);
- ``failure-detector-jobs`` (GFAIR_JOBS): submissions (a job's own ``max_retries``), the
  executor's lifecycle reports (where each job runs, its progress and checkpoints), ``exited``
  (classified and decided: completed, retried or failed) and cancellations.

A timer every ``check_interval_s`` moves silent nodes to suspected, then failed (listing the
jobs that ran there), and kills and retries jobs that stopped making progress. Silence counts
from when a heartbeat was read: while a heartbeat of every node still waits on
``failure-detector-nodes`` (the broker's count), the detector is behind, not the nodes
silent, and it judges no node until it has read them (`gfair.core.health.behind`). Where the
broker does not answer that count, the freshest heartbeat read tells it
(`gfair.core.health.lagging`).

Exactly-once effect on at-least-once delivery: every decision is published first, under ids
derived from its cause (the input event, or the silence or hang it concerns), then written to
the buckets (``gfair_nodes``, ``gfair_failures``), and only then applied in memory. A crash in
between makes the redelivered input (or the next check) decide the same again; JetStream drops
the repeated ids. Only one detector may run per cluster: it is the single writer of both
buckets.

The writes go out behind (`WriteBehind`): sent as decided, awaited together when the batch
settles (or at the end of a check), before any input that caused them is acknowledged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import TypeVar

import structlog
from opentelemetry import trace

from gfair.bus.key_value import KeyValue, KvEntry
from gfair.bus.metrics import export_from_zero, gfair_metrics
from gfair.bus.publisher import derived_event_id
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.service import Emit, Service
from gfair.bus.transport import BusError
from gfair.bus.write_behind import WriteBehind
from gfair.core import health
from gfair.events.envelope import Clock, Envelope, utc_now
from gfair.events.jobs import (
    JobCancelled,
    JobCheckpointed,
    JobExited,
    JobFailed,
    JobMigrated,
    JobProgress,
    JobResumed,
    JobRetried,
    JobStarted,
    JobSuspended,
)
from gfair.events.nodes import NodeHeartbeat, NodeRegistered, NodeUncordoned
from gfair.events.states import NodeState
from gfair.events.submission import JobSubmitted
from gfair.state.buckets import job_key
from gfair.state.job_failures import FAILURES, JobFailureRecord
from gfair.state.node_record import BUCKET as NODES_BUCKET
from gfair.state.node_record import NodeRecord, node_key
from gfair_services.failure_detector.change import Change
from gfair_services.failure_detector.failure_decision import FAILURE_CLASSES
from gfair_services.failure_detector.job_book import JobBook
from gfair_services.failure_detector.node_book import NodeBook
from gfair_services.failure_detector.settings import FailureDetectorSettings
from gfair_services.retention import EndedJobs
from gfair_services.skeleton import Consumes, Every, declare, started

SERVICE_NAME = "failure-detector"
T = TypeVar("T")

# What was decided about a failure, as `gfair.job.failures` labels it.
RETRIED, FAILED = "retried", "failed"
DECISIONS = (RETRIED, FAILED)

_log = structlog.get_logger("gfair.services.failure_detector")
_tracer = trace.get_tracer("gfair.services.failure_detector")

NodeInput = NodeRegistered | NodeHeartbeat | NodeUncordoned
JobInput = (
    JobSubmitted
    | JobStarted
    | JobResumed
    | JobProgress
    | JobCheckpointed
    | JobSuspended
    | JobMigrated
    | JobExited
    | JobCancelled
)


class FailureDetector:
    def __init__(
        self,
        settings: FailureDetectorSettings | None = None,
        *,
        clock: Clock = utc_now,
    ) -> None:
        self.settings = settings or FailureDetectorSettings()
        self._clock = clock
        self._heartbeat = self.settings.heartbeat_policy()
        self.nodes = NodeBook(
            self._heartbeat,
            self.settings.quarantine_policy(),
            heartbeat_record_s=self.settings.heartbeat_record_s,
        )
        self.jobs = JobBook(self.settings.retry_policy(), hang_after_s=self.settings.hang_after_s)
        # Handlers and the timer interleave at every await; one decision at a time.
        self._lock = asyncio.Lock()
        self._runtime: ServiceRuntime | None = None
        self._nodes_kv: KeyValue | None = None
        self._jobs_kv: KeyValue | None = None
        self._writes = WriteBehind()
        # Keys `gfair_failures` holds: a job under any other key has no record to read.
        self._stored_jobs: set[str] = set()
        # Ended jobs' keys, with when each ended: purged a retention after (`purge`).
        self._ended = EndedJobs()
        # Whether the last check found heartbeats waiting unread (and judged no node).
        self.behind = False
        self._backlog_unknown = False
        # When the freshest heartbeat read was sent (its node's clock), for `health.lagging`.
        self._newest_sent: float | None = None
        self.service = self._build()

    def _build(self) -> Service:
        # `gfair_failures` is one of `gfair.state.buckets.ALL`, replicated like the others.
        settle = self._writes.settle
        service = declare(
            SERVICE_NAME,
            self.settings,
            start=self.start,
            consumes=(
                # A heartbeat of every node every few seconds, and several progress reports a
                # slice per running job, each only noting it alive: no span each.
                Consumes("nodes", self.on_node_event, settle=settle, untraced=(NodeHeartbeat,)),
                Consumes("jobs", self.on_job_event, settle=settle, untraced=(JobProgress,)),
            ),
            timers=(
                Every("failure-check", self.settings.check_interval_s, self.check),
                Every("job-retention", self.settings.retention_check_s, self.purge),
            ),
        )
        self._heartbeats = service.routes[0]
        return service

    # ----- start -------------------------------------------------------------------------

    async def start(self, runtime: ServiceRuntime) -> None:
        """Rebuild both books from the buckets before any handler runs (docs/design.md §3.3)."""
        self._runtime = runtime
        export_from_zero(
            gfair_metrics().failures,
            ({"failure_class": c, "decision": d} for c in FAILURE_CLASSES for d in DECISIONS),
        )
        self._nodes_kv = await runtime.key_value(NODES_BUCKET)
        self._jobs_kv = await runtime.key_value(FAILURES.name)
        now = self._clock()
        nodes = [
            NodeRecord.model_validate_json(entry.value) for entry in await _entries(self._nodes_kv)
        ]
        stored_jobs = await _entries(self._jobs_kv)
        self._stored_jobs = {entry.key for entry in stored_jobs}
        jobs = [JobFailureRecord.model_validate_json(entry.value) for entry in stored_jobs]
        # Records written before they noted when their job ended count from this start.
        for job in jobs:
            if job.terminal is not None:
                self._ended.note(job.key, job.ended_at or now)
        self.nodes.restore(nodes, now)
        self.jobs.restore(jobs, now)
        _log.info("failure detector restored", nodes=len(nodes), live_jobs=self.jobs.live())

    # ----- handlers ----------------------------------------------------------------------

    async def on_node_event(self, envelope: Envelope, data: NodeInput) -> Sequence[Emit]:
        async with self._lock:
            now = self._clock()
            if isinstance(data, NodeRegistered):
                change = self.nodes.registered(data, now)
            elif isinstance(data, NodeHeartbeat):
                sent = envelope.time.timestamp()
                if self._newest_sent is None or sent > self._newest_sent:
                    self._newest_sent = sent
                for job in data.running:
                    await self._ensure_job(job.user, job.job_id, now)
                was = self.nodes.get(data.node_id)
                change = self.nodes.heartbeat(data, now, self.jobs.running_on)
                if data.fault is not None and (was is None or was.state is not NodeState.FAILED):
                    change = change + self.jobs.node_lost(data.node_id, now)
                else:
                    change = change + self.jobs.fence(
                        data.node_id, data.running, now, grace_s=self.settings.fence_grace_s
                    )
            else:
                change = self.nodes.uncordon(data, now)
                if change.empty:
                    _log.info("uncordon of a node not quarantined ignored", node_id=data.node_id)
            await self._commit(change, now, cause=envelope)
        return []

    async def on_job_event(self, envelope: Envelope, data: JobInput) -> Sequence[Emit]:
        async with self._lock:
            now = self._clock()
            await self._ensure_job(data.user, data.job_id, now)
            if isinstance(data, JobProgress):
                self.jobs.progressed(data, now)
                return []
            if isinstance(data, JobExited):
                change = self._decide_exit(data, now)
            elif isinstance(data, JobSubmitted):
                change = self.jobs.submitted(data, now)
            elif isinstance(data, JobStarted | JobResumed):
                correlation = envelope.correlation_id or envelope.id
                change = self.jobs.started(data, correlation, now)
            elif isinstance(data, JobCheckpointed):
                change = self.jobs.checkpointed(data)
            elif isinstance(data, JobSuspended | JobMigrated):
                change = self.jobs.stopped(data)
            else:
                change = self.jobs.cancelled(data, now)
            await self._commit(change, now, cause=envelope)
        return []

    def _decide_exit(self, data: JobExited, now: datetime) -> Change:
        with _tracer.start_as_current_span(
            "failure_detector.classify_exit",
            attributes={
                "gfair.user": data.user,
                "gfair.job_id": data.job_id,
                "gfair.server": data.node_id,
                "gfair.attempt": data.attempt,
            },
        ) as span:
            verdict = self.jobs.exited(data, now)
            change = verdict.change
            if verdict.node_failure is not None:
                change = change + self.nodes.failure(data.node_id, verdict.node_failure, now)
            for event in change.events:
                span.add_event(event.EVENT_TYPE)
            if change.empty:
                _log.info(
                    "exit of a finished job or an earlier attempt ignored",
                    job=f"{data.user}/{data.job_id}",
                    attempt=data.attempt,
                )
            return change

    # ----- timer -------------------------------------------------------------------------

    async def check(self) -> Sequence[Emit]:
        """Liveness of every node (unless heartbeats wait unread), then progress of every
        running job."""
        unread = await self._heartbeats_unread()
        async with self._lock:
            now = self._clock()
            deaf = self.nodes.deaf_since
            behind = self._behind(unread, now.timestamp())
            lapses = [] if behind else self.nodes.check(now, self.jobs.running_on)
            if deaf is None and self.nodes.deaf_since is not None:
                _log.warning(
                    "no node heard: declaring none failed until one is (the broker, or this "
                    "detector's feed, is the likelier cause than every node at once)",
                    nodes=len(self.nodes.records()),
                )
            for lapse in lapses:
                change = lapse.change
                if lapse.failed:
                    change = change + self.jobs.node_lost(lapse.node_id, now)
                with _tracer.start_as_current_span(
                    "failure_detector.node_lapse",
                    attributes={"gfair.server": lapse.node_id, "gfair.failed": lapse.failed},
                ):
                    await self._commit(change, now, cause_key=lapse.cause)
            for hang in self.jobs.hung(now):
                with _tracer.start_as_current_span(
                    "failure_detector.hung_job",
                    attributes={"gfair.user": hang.job.user, "gfair.job_id": hang.job.job_id},
                ):
                    await self._commit(
                        hang.change, now, cause_key=hang.cause, correlation_id=hang.correlation_id
                    )
            await self._writes.settle()
        return []

    async def _heartbeats_unread(self) -> int | None:
        """Heartbeats (and other node events) on the broker not yet read; None: unknown."""
        if self._runtime is None:
            return None
        try:
            unread = await self._runtime.bus.unread(self._heartbeats.consumer)
        except BusError as exc:
            # The broker unreachable: no heartbeat is heard either, and silence of every node
            # at once is the detector's own deafness (`gfair.core.health.unheard`).
            if not self._backlog_unknown:
                _log.info(
                    "heartbeat backlog unknown: judging by the freshest heartbeat read",
                    error=repr(exc),
                )
            self._backlog_unknown = True
            return None
        self._backlog_unknown = False
        return unread

    def _behind(self, unread: int | None, now: float) -> bool:
        if unread is None:
            behind = health.lagging(self._newest_sent, now, self._heartbeat)
        else:
            behind = health.behind(unread, len(self.nodes.records()))
        if behind and not self.behind:
            lag = None if self._newest_sent is None else round(now - self._newest_sent, 1)
            _log.warning(
                "heartbeats wait unread: judging no node's liveness until they are read",
                unread=unread,
                newest_heartbeat_age_s=lag,
                nodes=len(self.nodes.records()),
            )
        elif self.behind and not behind:
            _log.info("heartbeats read: judging liveness again", unread=unread)
        self.behind = behind
        return behind

    # ----- commit ------------------------------------------------------------------------

    async def _commit(
        self,
        change: Change,
        now: datetime,
        *,
        cause: Envelope | None = None,
        cause_key: str | None = None,
        correlation_id: str | None = None,
    ) -> None:
        if change.empty:
            return
        runtime = self._started(self._runtime)
        origin = cause.id if cause is not None else cause_key
        assert origin is not None, "a change has a cause"
        if cause is not None:
            correlation_id = cause.correlation_id or cause.id
        for index, event in enumerate(change.events):
            subject = event.subject()
            await runtime.publisher.publish(
                event,
                event_id=derived_event_id(origin, index, event.EVENT_TYPE, subject),
                causation=cause,
                correlation_id=correlation_id,
            )
            _log.info("decided", event_type=event.EVENT_TYPE, subject=subject, **_why(event))
            if isinstance(event, JobRetried | JobFailed):
                decision = RETRIED if isinstance(event, JobRetried) else FAILED
                gfair_metrics().failures.add(
                    1, {"failure_class": event.failure_class.value, "decision": decision}
                )
        nodes_kv, jobs_kv = self._started(self._nodes_kv), self._started(self._jobs_kv)
        for node in change.nodes:
            self._writes.put(nodes_kv, node_key(node.node_id), node.model_dump_json().encode())
        for job in change.jobs:
            self._writes.put(jobs_kv, job.key, job.model_dump_json().encode())
            self._stored_jobs.add(job.key)
            if job.terminal is not None:
                self._ended.note(job.key, job.ended_at or now)
        self.nodes.apply(change, now)
        self.jobs.apply(change, now)

    # ----- retention ---------------------------------------------------------------------

    async def purge(self) -> list[Emit]:
        """Delete the records of jobs that ended more than `job_retention_s` ago."""
        async with self._lock:
            cutoff = self.settings.retention_cutoff(self._clock())
            if self._ended.before(cutoff):
                await self._writes.settle()  # no write of theirs may land after the delete
                kv = self._started(self._jobs_kv)
                self._stored_jobs -= set(await self._ended.purge(kv, cutoff))
        return []

    async def _ensure_job(self, user: str, job_id: str, now: datetime) -> None:
        """Bring a job's record into memory: finished jobs are kept only in the bucket."""
        if self.jobs.knows(user, job_id):
            return
        key = job_key(user, job_id)
        kv = self._started(self._jobs_kv)
        if key not in self._stored_jobs:
            self.jobs.add(JobFailureRecord(user=user, job_id=job_id), now)
            return
        if self._writes.writing(kv, key):
            await self._writes.settle()  # a read must see what was written
        entry = await kv.get(key)
        record = (
            JobFailureRecord.model_validate_json(entry.value)
            if entry is not None
            else JobFailureRecord(user=user, job_id=job_id)
        )
        self.jobs.add(record, now)

    @staticmethod
    def _started(value: T | None) -> T:
        return started(value, "the failure detector (its buckets)")


async def _entries(kv: KeyValue) -> list[KvEntry]:
    found = []
    for key in await kv.keys():
        entry = await kv.get(key)
        if entry is not None:
            found.append(entry)
    return found


def _why(event: object) -> dict[str, object]:
    fields = ("node_id", "user", "job_id", "attempt", "failure_class", "reason", "delay_s")
    return {name: getattr(event, name) for name in fields if getattr(event, name, None) is not None}


def build_service(settings: FailureDetectorSettings | None = None) -> Service:
    return FailureDetector(settings).service
