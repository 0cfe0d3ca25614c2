"""The placement service on the in-memory bus: admission, the job records, cancels."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import pytest

from gfair.bus.dead_letter import DeadLetter, DeadLetterReason
from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.transport import BusError
from gfair.core.throughput import ThroughputEstimator
from gfair.events.commands import KillCommand
from gfair.events.envelope import Envelope
from gfair.events.jobs import (
    JobAccepted,
    JobCancelled,
    JobCheckpointed,
    JobCompleted,
    JobHeld,
    JobPlaced,
    JobRejected,
    JobRetried,
    JobStarted,
)
from gfair.events.nodes import NodeFailed
from gfair.events.reasons import FailureClass, RejectionCode
from gfair.events.scheduling import QuantumTicked
from gfair.events.states import JobState
from gfair.events.submission import JobCancelRequested
from gfair.state.buckets import JOBS, UnreadableRecord
from gfair.state.job_record import JobRecord, load_job, load_jobs
from gfair_services.placement import PlacementService, PlacementSettings
from support.waiting import eventually

from .scheduling_harness import FAST, Probe, registered, submitted

RESNET = "ResNet-50 (batch size 32)"
# K80 is 3x slower than V100 for this type; "big" does not fit on K80 at all.
TABLE = {RESNET: {"k80": 1.0, "v100": 3.0}, "big": {"k80": 0.0, "v100": 1.0}}
JOBS_STREAM = "GFAIR_JOBS"
COMMANDS = "GFAIR_COMMANDS"


@asynccontextmanager
async def placement(
    bus: InMemoryBus, settings: PlacementSettings | None = None
) -> AsyncIterator[PlacementService]:
    state = PlacementService(settings or PlacementSettings(), ThroughputEstimator(TABLE))
    async with ServiceRuntime(state.service(), bus, settings=FAST):
        yield state


@pytest.fixture
def bus() -> InMemoryBus:
    return InMemoryBus()


@pytest.fixture
def probe(bus: InMemoryBus) -> Probe:
    return Probe(bus)


async def record(bus: InMemoryBus, user: str, job_id: str) -> JobRecord:
    stored = await load_job(await bus.key_value(JOBS.name), user, job_id)
    assert stored is not None, f"no record for {user}/{job_id}"
    return stored.record


async def register(probe: Probe, state: PlacementService, *nodes: tuple[str, int]) -> None:
    """Register nodes ("v100-0", 4) and wait until placement knows them."""
    for node_id, gpus in nodes:
        await probe.publish(registered(node_id, node_id.split("-")[0], gpus))
    await eventually(lambda: all(n in state.inventory for n, _ in nodes))


async def tick(probe: Probe, quantum: int) -> None:
    await probe.publish(QuantumTicked(quantum=quantum, starts_at=datetime.now(UTC), length_s=1.0))


async def test_a_job_is_accepted_and_recorded(bus: InMemoryBus, probe: Probe) -> None:
    async with placement(bus) as state:
        await register(probe, state, ("v100-0", 4))
        await probe.publish(
            submitted("alice", "j1", 2, job_type=RESNET, env={"SEED": "7"}, tickets=2.0)
        )
        await probe.wait_for(JOBS_STREAM, JobAccepted)
        await probe.drained()
    accepted = probe.payloads(JOBS_STREAM, JobAccepted)
    assert [(a.job_id, a.gpus, a.job_type) for a in accepted] == [("j1", 2, RESNET)]
    assert probe.payloads(JOBS_STREAM, JobPlaced) == []  # where it runs is the scheduler's
    saved = await record(bus, "alice", "j1")
    assert saved.state is JobState.QUEUED and saved.servers == ()
    assert saved.submission.command == ("python", "-c", "pass")
    assert saved.submission.env == {"SEED": "7"} and saved.submission.weight == 2.0
    assert [d.kind for d in saved.decisions] == ["admission"]


async def test_an_admission_carries_what_the_jobs_starts_need_under_the_jobs_correlation(
    bus: InMemoryBus, probe: Probe
) -> None:
    """Split-stride schedules and starts a job from its admission alone, at once or once the
    jobs it waits for completed: the admission carries the submission's command line,
    environment, working directory, weight and prepared start, under its correlation id."""
    async with placement(bus) as state:
        await register(probe, state, ("v100-0", 4))
        first = await probe.publish(
            submitted("alice", "a", 2, env={"SEED": "7"}, working_dir="/data", tickets=3.0)
        )
        later = await probe.publish(submitted("alice", "b", 1, after_ok=("a",), prepare=True))
        await probe.wait_for(JOBS_STREAM, JobHeld)
        await probe.publish(JobCompleted(user="alice", job_id="a", attempt=1))
        await probe.wait_for(JOBS_STREAM, JobAccepted, lambda found: len(found) == 2)
    accepted = {
        data.job_id: (envelope, data) for envelope, data in probe.events(JOBS_STREAM, JobAccepted)
    }
    envelope, a = accepted["a"]
    assert a.launch is not None and a.launch.command == ("python", "-c", "pass")
    assert (a.launch.env, a.launch.working_dir) == ({"SEED": "7"}, "/data")
    assert (a.weight, a.prepare, a.attempt) == (3.0, False, 1)
    assert envelope.correlation_id == first.id
    envelope, b = accepted["b"]
    assert b.launch is not None and (b.weight, b.prepare) == (1.0, True)
    # Caused by a's completion, it still belongs to b's life.
    assert envelope.correlation_id == later.id


async def test_the_schedulers_placements_are_recorded(bus: InMemoryBus, probe: Probe) -> None:
    async with placement(bus) as state:
        await register(probe, state, ("v100-0", 4), ("v100-1", 4))
        await probe.publish(submitted("alice", "j1", 1))
        await probe.wait_for(JOBS_STREAM, JobAccepted)
        for server in ("v100-0", "v100-1"):
            await probe.publish(
                JobPlaced(user="alice", job_id="j1", servers=(server,), generation="v100")
            )
        await eventually(
            lambda: (
                state.book.get("alice.j1") is not None
                and state.book.get("alice.j1").record.servers == ("v100-1",)
            )  # type: ignore[union-attr]
        )
    saved = await record(bus, "alice", "j1")
    assert saved.state is JobState.PLACED and saved.generation == "v100"
    assert [d.text for d in saved.decisions if d.kind == "placement"] == [
        "placed on v100 v100-0 by the scheduler",
        "placed on v100 v100-1 by the scheduler",
    ]


async def test_submissions_breaking_the_limits_are_rejected_with_reasons(
    bus: InMemoryBus, probe: Probe
) -> None:
    settings = PlacementSettings(max_job_gpus=16, max_job_tickets=10, allowed_users="alice,bob")
    async with placement(bus, settings) as state:
        await register(probe, state, ("v100-0", 4))
        await register(probe, state, ("k80-0", 4))
        await probe.publish(submitted("alice", "too-many", 17))
        await probe.publish(submitted("alice", "unsatisfiable", 9))
        await probe.publish(submitted("alice", "heavy", 1, tickets=11.0))
        await probe.publish(submitted("mallory", "sneaky", 1))
        await probe.publish(submitted("bob", "nofit", 8, job_type="big"))
        rejected = await probe.wait_for(JOBS_STREAM, JobRejected, lambda found: len(found) == 5)
    by_job = {r.job_id: r for r in rejected}
    assert by_job["too-many"].code is RejectionCode.LIMIT_EXCEEDED
    assert "at most 16" in by_job["too-many"].reason
    assert by_job["unsatisfiable"].code is RejectionCode.UNSATISFIABLE
    assert "needs 9 GPUs" in by_job["unsatisfiable"].reason
    assert by_job["heavy"].code is RejectionCode.LIMIT_EXCEEDED
    assert by_job["sneaky"].code is RejectionCode.UNKNOWN_USER
    # "big" fits only on v100, which has 4 GPUs: 8 can never run anywhere.
    assert by_job["nofit"].code is RejectionCode.UNSATISFIABLE
    assert probe.payloads(JOBS_STREAM, JobAccepted) == []
    saved = await record(bus, "alice", "unsatisfiable")
    assert saved.state is JobState.REJECTED and saved.rejection_code is RejectionCode.UNSATISFIABLE


async def test_a_user_at_its_pending_cap_is_refused_until_a_job_ends(
    bus: InMemoryBus, probe: Probe
) -> None:
    async with placement(bus, PlacementSettings(max_pending_jobs=2)) as state:
        await register(probe, state, ("v100-0", 4))
        for job_id in ("j1", "j2", "j3"):
            await probe.publish(submitted("alice", job_id, 1))
        (refused,) = await probe.wait_for(JOBS_STREAM, JobRejected)
        await probe.publish(submitted("bob", "j1", 1))  # the cap is per user
        await probe.wait_for(JOBS_STREAM, JobAccepted, lambda found: len(found) == 3)
        await probe.publish(JobCancelRequested(user="alice", job_id="j1"))
        await eventually(lambda: state.book.unfinished("alice") == 1)
        await probe.publish(submitted("alice", "j4", 1))
        await probe.wait_for(JOBS_STREAM, JobAccepted, lambda found: len(found) == 4)
    assert (refused.job_id, refused.code) == ("j3", RejectionCode.TOO_MANY_PENDING)
    assert "2 unfinished jobs" in refused.reason and "max_pending_jobs 2" in refused.reason
    # Refused without a record, so a flood of them grows no bucket.
    assert await load_job(await bus.key_value(JOBS.name), "alice", "j3") is None
    assert (await record(bus, "alice", "j4")).state is JobState.QUEUED


async def test_a_duplicate_job_id_is_rejected_and_the_first_job_kept(
    bus: InMemoryBus, probe: Probe
) -> None:
    async with placement(bus) as state:
        await register(probe, state, ("v100-0", 4))
        await probe.publish(submitted("alice", "j1", 1))
        await probe.wait_for(JOBS_STREAM, JobAccepted)
        await probe.publish(submitted("alice", "j1", 2, command=("other",)))
        (rejected,) = await probe.wait_for(JOBS_STREAM, JobRejected)
        # Another user's namespace is separate: bob may use the same id.
        await probe.publish(submitted("bob", "j1", 1))
        await probe.wait_for(JOBS_STREAM, JobAccepted, lambda found: len(found) == 2)
    assert rejected.code is RejectionCode.DUPLICATE_JOB_ID
    saved = await record(bus, "alice", "j1")
    assert saved.submission.gpus == 1 and saved.state is JobState.QUEUED


async def test_a_rejected_job_id_may_be_submitted_again(bus: InMemoryBus, probe: Probe) -> None:
    async with placement(bus, PlacementSettings(max_job_gpus=2)) as state:
        await register(probe, state, ("v100-0", 4))
        await probe.publish(submitted("alice", "j1", 3))
        await probe.wait_for(JOBS_STREAM, JobRejected)
        await probe.publish(submitted("alice", "j1", 2))
        await probe.wait_for(JOBS_STREAM, JobAccepted)
    assert (await record(bus, "alice", "j1")).state is JobState.QUEUED


async def test_a_redelivered_submission_repeats_its_outputs_without_a_new_write(
    bus: InMemoryBus, probe: Probe
) -> None:
    state = PlacementService(PlacementSettings(), ThroughputEstimator(TABLE))
    runtime = ServiceRuntime(state.service(), bus, settings=FAST)
    await runtime.prepare()
    await state.start(runtime)
    node = Envelope.wrap(registered("v100-0", "v100", 4), source="test")
    await state.on_node_event(node, registered("v100-0", "v100", 4))
    job = submitted("alice", "j1", 1)
    envelope = Envelope.wrap(job, source="test")
    first = await state.on_job_event(envelope, job)
    await state.settle()  # what the runtime does before it publishes the outputs
    revision = (await state.kv.get("alice.j1")).revision  # type: ignore[union-attr]
    again = await state.on_job_event(envelope, job)
    await state.settle()
    assert [e.data for e in again] == [e.data for e in first]
    assert [e.data.EVENT_TYPE for e in first] == [JobAccepted.EVENT_TYPE]
    assert (await state.kv.get("alice.j1")).revision == revision  # type: ignore[union-attr]


async def test_a_failed_record_create_fails_its_submission_whoever_saw_it_first(
    bus: InMemoryBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cancel in the same batch awaits the create first and gets its failure: the batch must
    # still not be settled, or the admission would be announced for a record that never was.
    state = PlacementService(PlacementSettings(), ThroughputEstimator(TABLE))
    runtime = ServiceRuntime(state.service(), bus, settings=FAST)
    await runtime.prepare()
    await state.start(runtime)
    create = state.kv.create
    failing = {"alice.j1"}

    async def flaky_create(key: str, value: bytes) -> int:
        if key in failing:
            failing.discard(key)
            raise BusError(f"create {key}: not acknowledged")
        return await create(key, value)

    monkeypatch.setattr(state.kv, "create", flaky_create)
    job = submitted("alice", "j1", 1)
    envelope = Envelope.wrap(job, source="test")
    await state.on_job_event(envelope, job)
    cancel = JobCancelRequested(user="alice", job_id="j1")
    with pytest.raises(BusError):
        await state.on_job_event(Envelope.wrap(cancel, source="test"), cancel)
    with pytest.raises(BusError):
        await state.settle()
    assert await state.kv.get("alice.j1") is None
    again = await state.on_job_event(envelope, job)  # the batch, handled again
    await state.settle()
    assert [e.data.EVENT_TYPE for e in again] == [JobAccepted.EVENT_TYPE]
    assert (await record(bus, "alice", "j1")).state is JobState.QUEUED


async def test_a_job_is_accepted_before_any_node_registers(bus: InMemoryBus, probe: Probe) -> None:
    async with placement(bus):
        await probe.publish(submitted("alice", "early", 4))
        await probe.wait_for(JOBS_STREAM, JobAccepted)
    assert (await record(bus, "alice", "early")).state is JobState.QUEUED


async def test_a_failed_node_takes_its_processes_off_the_records(
    bus: InMemoryBus, probe: Probe
) -> None:
    async with placement(bus) as state:
        await register(probe, state, ("v100-0", 4), ("v100-1", 4))
        await probe.publish(submitted("alice", "j1", 2))
        await probe.wait_for(JOBS_STREAM, JobAccepted)
        await probe.publish(
            JobPlaced(user="alice", job_id="j1", servers=("v100-0",), generation="v100")
        )
        await probe.publish(
            JobStarted(user="alice", job_id="j1", node_id="v100-0", gpu_indices=(0, 1), attempt=1)
        )
        await probe.publish(NodeFailed(node_id="v100-0", reason="no heartbeat for 30s"))
        await eventually(
            lambda: (
                state.book.get("alice.j1") is not None
                and state.book.get("alice.j1").record.nodes == ()  # type: ignore[union-attr]
                and state.book.get("alice.j1").record.state is JobState.PLACED
            )  # type: ignore[union-attr]
        )
        await probe.drained()
    assert probe.payloads(COMMANDS, KillCommand) == []  # a dead node gets no commands


async def test_a_cancel_kills_the_job_on_its_nodes_once(bus: InMemoryBus, probe: Probe) -> None:
    async with placement(bus) as state:
        await register(probe, state, ("v100-0", 4))
        await probe.publish(submitted("alice", "j1", 1))
        await probe.wait_for(JOBS_STREAM, JobAccepted)
        await probe.publish(
            JobStarted(user="alice", job_id="j1", node_id="v100-0", gpu_indices=(0,), attempt=1)
        )
        await probe.publish(JobCancelRequested(user="alice", job_id="j1", reason="wrong data"))
        await probe.publish(JobCancelRequested(user="alice", job_id="j1"))
        (cancelled,) = await probe.wait_for(JOBS_STREAM, JobCancelled)
        await probe.drained()
    assert cancelled.previous_state is JobState.RUNNING and cancelled.reason == "wrong data"
    kills = probe.payloads(COMMANDS, KillCommand)
    assert [(k.node_id, k.job_id) for k in kills] == [("v100-0", "j1")]
    assert len(probe.payloads(JOBS_STREAM, JobCancelled)) == 1
    assert (await record(bus, "alice", "j1")).state is JobState.CANCELLED


async def test_lifecycle_events_keep_the_record_current(bus: InMemoryBus, probe: Probe) -> None:
    async with placement(bus) as state:
        await register(probe, state, ("v100-0", 4))
        await probe.publish(submitted("alice", "j1", 1))
        await probe.wait_for(JOBS_STREAM, JobAccepted)
        await probe.publish(
            JobStarted(user="alice", job_id="j1", node_id="v100-0", gpu_indices=(0,), attempt=1)
        )
        await probe.publish(
            JobCheckpointed(
                user="alice", job_id="j1", node_id="v100-0", attempt=1, step=40, path="/ck/40"
            )
        )
        await probe.publish(
            JobRetried(
                user="alice",
                job_id="j1",
                attempt=2,
                delay_s=1.0,
                failure_class=FailureClass.OUT_OF_MEMORY,
                reason="CUDA out of memory",
                resume_from_step=40,
            )
        )
        await probe.publish(JobCompleted(user="alice", job_id="j1", attempt=2))
        await probe.drained()
        saved = await record(bus, "alice", "j1")
        assert "alice.j1" not in state.book
    assert saved.state is JobState.COMPLETED
    assert saved.attempt == 2 and saved.last_checkpoint_step == 40
    assert saved.failure_class is FailureClass.OUT_OF_MEMORY
    assert [d.kind for d in saved.decisions][-2:] == ["retry", "completed"]


async def test_a_restarted_placement_rebuilds_its_view(bus: InMemoryBus, probe: Probe) -> None:
    async with placement(bus) as state:
        await register(probe, state, ("v100-0", 2), ("v100-1", 2))
        await probe.publish(submitted("alice", "j1", 2))
        await probe.wait_for(JOBS_STREAM, JobAccepted)
    async with placement(bus) as state:
        assert set(state.inventory.nodes) == {"v100-0", "v100-1"}
        assert "alice.j1" in state.book
        await probe.publish(submitted("alice", "j1", 1))
        await probe.publish(submitted("alice", "j2", 8))
        rejected = await probe.wait_for(JOBS_STREAM, JobRejected, lambda found: len(found) == 2)
    assert {r.job_id: r.code for r in rejected} == {
        "j1": RejectionCode.DUPLICATE_JOB_ID,  # the restarted service knew j1
        "j2": RejectionCode.UNSATISFIABLE,  # and the nodes
    }


async def test_a_record_that_is_no_record_is_dead_lettered_and_hides_no_other_job(
    bus: InMemoryBus, probe: Probe
) -> None:
    """Issue 41: a JetStream ack written over bob's record made `gfair jobs` fail for every
    user and bob's cancel be dead-lettered; a restart now passes over it, saying so."""
    async with placement(bus) as state:
        await register(probe, state, ("v100-0", 2))
        await probe.publish(submitted("alice", "a1", 1))
        await probe.wait_for(JOBS_STREAM, JobAccepted)
    garbage = b'{"stream":"GFAIR_JOBS","seq":35}'
    await (await bus.key_value(JOBS.name)).put("bob.b1", garbage)
    async with placement(bus) as state:
        assert "alice.a1" in state.book and "bob.b1" not in state.book
        letters = [DeadLetter.model_validate_json(m.data) for m in bus.stream_messages("GFAIR_DLQ")]
        assert [(d.reason, d.subject, d.original_payload()) for d in letters] == [
            (DeadLetterReason.UNREADABLE_RECORD, f"$KV.{JOBS.name}.bob.b1", garbage)
        ]
        # A read of every record (a tool's, `gfair jobs`) passes over it and names it.
        unreadable: list[UnreadableRecord] = []
        stored = await load_jobs(await bus.key_value(JOBS.name), unreadable=unreadable)
        assert [s.record.key for s in stored] == ["alice.a1"]
        assert [(u.key, u.value) for u in unreadable] == [("bob.b1", garbage)]


async def test_records_of_ended_jobs_are_purged_after_the_retention(
    bus: InMemoryBus, probe: Probe
) -> None:
    now = [datetime.now(UTC)]
    settings = PlacementSettings(job_retention_s=3600.0)

    def clock() -> datetime:
        return now[0]

    state = PlacementService(settings, ThroughputEstimator(TABLE), clock)
    async with ServiceRuntime(state.service(), bus, settings=FAST):
        await register(probe, state, ("v100-0", 4))
        for job_id in ("done", "live"):
            await probe.publish(submitted("alice", job_id, 1))
        await probe.publish(submitted("alice", "huge", 64))  # rejected: no pool that large
        await probe.wait_for(JOBS_STREAM, JobAccepted, lambda found: len(found) == 2)
        await probe.wait_for(JOBS_STREAM, JobRejected)
        await probe.publish(JobCompleted(user="alice", job_id="done", attempt=1))
        await eventually(lambda: "alice.done" not in state.book)
        await probe.drained()
        now[0] += timedelta(minutes=59)
        await state.purge()
        assert sorted(await (await bus.key_value(JOBS.name)).keys()) == [
            "alice.done",
            "alice.huge",
            "alice.live",
        ]

    # A restarted placement knows from the records when each ended.
    state = PlacementService(settings, ThroughputEstimator(TABLE), clock)
    async with ServiceRuntime(state.service(), bus, settings=FAST):
        now[0] += timedelta(minutes=2)
        await state.purge()
        assert await (await bus.key_value(JOBS.name)).keys() == ["alice.live"]
        assert (await record(bus, "alice", "live")).state is JobState.QUEUED
        # The id is free again.
        await probe.publish(submitted("alice", "done", 1))
        await probe.wait_for(JOBS_STREAM, JobAccepted, lambda found: len(found) == 3)
        await probe.drained()
    assert (await record(bus, "alice", "done")).state is JobState.QUEUED
