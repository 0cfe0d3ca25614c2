"""The failure detector on the in-memory bus, with its clock in the test's hands.

Inputs are published as the executor and tools would publish them; the detector's checks (its
timer) are called directly at chosen instants, so heartbeat timelines are exact.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest

from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.publisher import EventPublisher
from gfair.bus.runner import RunnerSettings
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.service import Emit
from gfair.events.commands import KillCommand
from gfair.events.envelope import Envelope, EventData
from gfair.events.fields import JobRef
from gfair.events.jobs import (
    JobCancelled,
    JobCheckpointed,
    JobCompleted,
    JobExited,
    JobFailed,
    JobProgress,
    JobRetried,
    JobStarted,
    JobSuspended,
)
from gfair.events.nodes import (
    GpuInfo,
    NodeFailed,
    NodeHeartbeat,
    NodeQuarantined,
    NodeRecovered,
    NodeRegistered,
    NodeSuspected,
    NodeUncordoned,
)
from gfair.events.reasons import FailureClass, SuspendReason
from gfair.events.states import JobState, NodeState
from gfair.events.submission import JobSubmitted
from gfair.state.job_failures import FAILURES, JobFailureRecord
from gfair.state.node_record import BUCKET as NODES_BUCKET
from gfair.state.node_record import NodeRecord
from gfair_services.failure_detector import FailureDetector, Settings
from gfair_services.failure_detector.service import JobInput, NodeInput
from support.clock import FakeClock
from support.waiting import eventually

FAST = RunnerSettings(batch=10, fetch_timeout_s=0.02, error_pause_s=0.02)
T0 = datetime(2025, 3, 14, 9, 0, tzinfo=UTC)


def settings(**overrides: object) -> Settings:
    values: dict[str, object] = {
        "suspect_after_s": 15.0,
        "fail_after_s": 60.0,
        # The tests call `check` themselves; the timer must stay out of the way.
        "check_interval_s": 3600.0,
        "hang_after_s": 120.0,
        "retry_base_s": 10.0,
        "retry_jitter": 0.1,
        "quarantine_failures": 3,
        "quarantine_window_s": 3600.0,
        "heartbeat_record_s": 0.0,
    } | overrides
    return Settings(**values)  # type: ignore[arg-type]


class ObservedDetector(FailureDetector):
    """Remembers which inputs it finished handling, so tests wait for exactly those."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.handled: set[str] = set()
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    async def on_node_event(self, envelope: Envelope, data: NodeInput) -> Sequence[Emit]:
        outputs = await super().on_node_event(envelope, data)
        self.handled.add(envelope.id)
        return outputs

    async def on_job_event(self, envelope: Envelope, data: JobInput) -> Sequence[Emit]:
        outputs = await super().on_job_event(envelope, data)
        self.handled.add(envelope.id)
        return outputs


class Harness:
    def __init__(self, bus: InMemoryBus, clock: FakeClock, detector: ObservedDetector) -> None:
        self.bus = bus
        self.clock = clock
        self.detector = detector
        self.tool = EventPublisher(bus, "test")
        self.outputs_seen = 0

    async def send(self, data: EventData) -> Envelope:
        """Publish as a producer would, and wait until the detector has handled it.

        Handled means settled too: its writes, which go out behind, are acknowledged.
        """
        envelope = await self.tool.publish(data)
        await eventually(lambda: envelope.id in self.detector.handled and self.bus.backlog() == 0)
        return envelope

    async def outputs(self, *types: type[EventData]) -> list[EventData]:
        """Everything the detector published so far, of `types`, oldest first."""
        found: list[EventData] = []
        wanted = {t.EVENT_TYPE: t for t in types}
        for stream in ("GFAIR_JOBS", "GFAIR_NODES", "GFAIR_COMMANDS"):
            async for message in self.bus.history(stream):
                envelope = Envelope.model_validate_json(message.data)
                if envelope.source == "failure-detector" and envelope.type in wanted:
                    found.append(wanted[envelope.type].model_validate(envelope.data))
        return found

    async def node(self, node_id: str) -> NodeRecord:
        kv = await self.bus.key_value(NODES_BUCKET)
        entry = await kv.get(node_id)
        assert entry is not None, f"no record of node {node_id}"
        return NodeRecord.model_validate_json(entry.value)

    async def job(self, user: str, job_id: str) -> JobFailureRecord:
        kv = await self.bus.key_value(FAILURES.name)
        entry = await kv.get(f"{user}.{job_id}")
        assert entry is not None, f"no failure record of {user}/{job_id}"
        return JobFailureRecord.model_validate_json(entry.value)

    async def check(self, at_s: float) -> None:
        self.clock.at(at_s)
        await self.detector.check()


@pytest.fixture
async def bus() -> AsyncIterator[InMemoryBus]:
    memory = InMemoryBus()
    try:
        yield memory
    finally:
        await memory.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
async def harness(bus: InMemoryBus, clock: FakeClock) -> AsyncIterator[Harness]:
    detector = ObservedDetector(settings(), clock=clock)
    async with ServiceRuntime(detector.service, bus, settings=FAST):
        yield Harness(bus, clock, detector)


def registered(node_id: str = "n1", gpus: int = 4) -> NodeRegistered:
    return NodeRegistered(
        node_id=node_id,
        hostname=f"{node_id}.example",
        gpus=tuple(
            GpuInfo(
                index=i,
                uuid=f"GPU-{node_id}-{i}",
                name="Tesla V100-SXM2-16GB",
                generation="v100",
                memory_bytes=16 << 30,
            )
            for i in range(gpus)
        ),
        heartbeat_interval_s=5.0,
        simulated=True,
    )


def heartbeat(node_id: str = "n1", seq: int = 1, *running: JobRef) -> NodeHeartbeat:
    return NodeHeartbeat(node_id=node_id, seq=seq, running=running)


def started(job_id: str, node_id: str = "n1", attempt: int = 1, user: str = "alice") -> JobStarted:
    return JobStarted(user=user, job_id=job_id, node_id=node_id, gpu_indices=(0,), attempt=attempt)


def exited(
    job_id: str,
    *,
    attempt: int = 1,
    node_id: str = "n1",
    exit_code: int | None = 1,
    signal: int | None = None,
    stderr: str = "",
    xids: tuple[int, ...] = (),
    user: str = "alice",
) -> JobExited:
    return JobExited(
        user=user,
        job_id=job_id,
        node_id=node_id,
        attempt=attempt,
        exit_code=exit_code,
        signal=signal,
        runtime_s=12.0,
        stderr_tail=stderr,
        xid_errors=xids,
    )


# ----- node liveness --------------------------------------------------------------------------


async def test_silent_node_is_suspected_then_failed_and_recovers(harness: Harness) -> None:
    job = JobRef(user="alice", job_id="j1")
    await harness.send(registered("n1"))
    await harness.send(started("j1", "n1"))
    await harness.send(heartbeat("n1", 1, job))

    await harness.check(10.0)
    assert await harness.outputs(NodeSuspected, NodeFailed) == []
    assert (await harness.node("n1")).state is NodeState.READY

    await harness.check(16.0)
    (suspected,) = await harness.outputs(NodeSuspected)
    assert isinstance(suspected, NodeSuspected)
    assert suspected.missed_heartbeats == 3  # 16 s of silence at a 5 s interval
    assert suspected.last_heartbeat == T0
    assert (await harness.node("n1")).state is NodeState.SUSPECTED

    # A second check in the same silence says nothing new.
    await harness.check(20.0)
    assert len(await harness.outputs(NodeSuspected)) == 1

    harness.clock.at(25.0)
    await harness.send(heartbeat("n1", 2, job))
    (recovered,) = await harness.outputs(NodeRecovered)
    assert isinstance(recovered, NodeRecovered)
    assert recovered.reason is not None and "25.0s of silence" in recovered.reason
    assert (await harness.node("n1")).state is NodeState.READY

    # Silent again, checked only after fail_after_s: failed at once, listing its job.
    await harness.check(25.0 + 61.0)
    (failed,) = await harness.outputs(NodeFailed)
    assert isinstance(failed, NodeFailed)
    assert failed.jobs == (job,)
    assert "61.0s" in failed.reason
    record = await harness.node("n1")
    assert record.state is NodeState.FAILED
    assert [t.state for t in record.transitions] == [
        NodeState.READY,
        NodeState.SUSPECTED,
        NodeState.READY,
        NodeState.FAILED,
    ]
    # The job no longer runs anywhere as far as the detector knows: no hang will be declared.
    assert (await harness.job("alice", "j1")).running_on is None
    assert (await harness.job("alice", "j1")).decisions[-1].outcome == "node_lost"

    harness.clock.at(200.0)
    await harness.send(registered("n1"))
    assert len(await harness.outputs(NodeRecovered)) == 2
    assert (await harness.node("n1")).state is NodeState.READY


async def test_no_node_is_failed_while_every_node_is_silent_at_once(harness: Harness) -> None:
    # Two nodes fall silent together (the broker was lost): the detector suspects both, fails
    # neither, and once it hears one again the other's silence counts from then.
    await harness.send(registered("n1"))
    await harness.send(registered("n2"))
    await harness.check(200.0)
    assert await harness.outputs(NodeFailed) == []
    assert len(await harness.outputs(NodeSuspected)) == 2
    for seq, at_s in enumerate(range(210, 275, 5), start=1):  # n1 is heard again, every 5 s
        harness.clock.at(float(at_s))
        await harness.send(heartbeat("n1", seq))
        if at_s == 260:
            await harness.check(260.0)  # n2 silent 50 s counted from 210: suspected only
            assert await harness.outputs(NodeFailed) == []
    await harness.check(271.0)  # n2: 61 s since the detector could hear again
    (failed,) = await harness.outputs(NodeFailed)
    assert isinstance(failed, NodeFailed)
    assert failed.node_id == "n2"
    assert "61.0s" in failed.reason


async def test_failed_node_jobs_include_those_only_the_detector_knew_of(
    harness: Harness,
) -> None:
    await harness.send(registered("n2"))
    await harness.send(heartbeat("n2", 1))  # reports nothing running
    await harness.send(started("j7", "n2", user="bob"))
    await harness.check(70.0)
    (failed,) = await harness.outputs(NodeFailed)
    assert isinstance(failed, NodeFailed)
    assert failed.jobs == (JobRef(user="bob", job_id="j7"),)


async def test_a_node_back_from_a_partition_stops_copies_running_elsewhere(
    harness: Harness,
) -> None:
    job = JobRef(user="alice", job_id="j1")
    await harness.send(registered("n1"))
    await harness.send(registered("n2"))
    await harness.send(started("j1", "n1"))
    harness.clock.at(65.0)
    await harness.send(heartbeat("n2", 1))  # n2 is heard: n1's silence is n1's own
    await harness.check(70.0)
    failed = [e for e in await harness.outputs(NodeFailed) if isinstance(e, NodeFailed)]
    assert [(e.node_id, e.jobs) for e in failed] == [("n1", (job,))]
    harness.clock.at(75.0)
    await harness.send(started("j1", "n2"))  # placement moved it; it resumed there

    # n1 was only cut off: its heartbeats return, still listing its copy of j1.
    harness.clock.at(90.0)
    await harness.send(heartbeat("n1", 9, job))
    assert await harness.outputs(KillCommand) == []  # within the grace a migration needs
    harness.clock.at(120.0)
    await harness.send(heartbeat("n1", 10, job))
    (kill,) = await harness.outputs(KillCommand)
    assert isinstance(kill, KillCommand)
    assert (kill.node_id, kill.job_id, kill.attempt) == ("n1", "j1", 1)
    assert "runs on n2" in kill.reason
    # Only a copy that started before the start on n2 was heard of is one left behind.
    assert kill.started_before == T0 + timedelta(seconds=75)
    # The killed copy's end decides nothing: the job lives on on n2.
    await harness.send(exited("j1", node_id="n1", exit_code=None, signal=15))
    assert await harness.outputs(JobRetried, JobFailed) == []
    assert (await harness.job("alice", "j1")).running_on == "n2"


def progress(
    job_id: str,
    iterations: int,
    checkpoint_step: int | None,
    *,
    node_id: str = "n1",
    attempt: int = 1,
) -> JobProgress:
    return JobProgress(
        user="alice",
        job_id=job_id,
        node_id=node_id,
        generation="v100",
        attempt=attempt,
        minibatches_per_s=2.0,
        iterations=iterations,
        checkpoint_step=checkpoint_step,
    )


async def test_progress_reaches_the_record_with_its_next_change(harness: Harness) -> None:
    # Progress is noted in memory only; the record takes the run's own latest steps and
    # checkpoint in when it next changes (here: its node lost), not a stale copy's.
    await harness.send(registered("n1"))
    await harness.send(registered("n2"))
    await harness.send(started("j9", "n1"))
    await harness.send(progress("j9", 200, 150))
    await harness.send(progress("j9", 350, None))  # no checkpoint since: 150 stays the last
    await harness.send(progress("j9", 900, 880, node_id="n2"))  # a copy elsewhere
    await harness.send(progress("j9", 990, 970, attempt=2))  # an attempt it never started
    stored = await harness.job("alice", "j9")
    assert (stored.iterations, stored.last_checkpoint_step) == (None, None)  # not written yet
    harness.clock.at(65.0)
    await harness.send(heartbeat("n2", 1))  # n2 is heard: n1's silence is n1's own
    await harness.check(70.0)
    record = await harness.job("alice", "j9")
    assert (record.iterations, record.last_checkpoint_step) == (350, 150)
    assert record.decisions[-1].outcome == "node_lost"
    assert record.decisions[-1].resume_from_step == 150
    # Then it is started again elsewhere and exits: its new run's progress counts.
    harness.clock.at(75.0)
    await harness.send(started("j9", "n2", attempt=2))
    await harness.send(progress("j9", 400, 390, node_id="n2", attempt=2))
    await harness.send(exited("j9", node_id="n2", attempt=2, exit_code=None, signal=9))
    (retry,) = await harness.outputs(JobRetried)
    assert isinstance(retry, JobRetried)
    assert retry.resume_from_step == 390
    assert (await harness.job("alice", "j9")).iterations == 400


# ----- exit classification and retries ---------------------------------------------------------


async def test_user_error_is_retried_once_then_fails(harness: Harness) -> None:
    await harness.send(started("j1"))
    await harness.send(exited("j1", exit_code=2, stderr="Traceback...\nValueError: bad lr"))
    (retry,) = await harness.outputs(JobRetried)
    assert isinstance(retry, JobRetried)
    assert retry.attempt == 2
    assert retry.failure_class is FailureClass.USER_ERROR
    assert 9.0 <= retry.delay_s <= 11.0  # base 10 s, jitter 10 %
    assert "ValueError: bad lr" in retry.reason

    # A late copy of attempt 1's exit changes nothing.
    await harness.send(exited("j1", exit_code=2))
    assert len(await harness.outputs(JobRetried, JobFailed)) == 1

    await harness.send(started("j1", attempt=2))
    await harness.send(exited("j1", attempt=2, exit_code=2, stderr="ValueError: bad lr"))
    (failed,) = await harness.outputs(JobFailed)
    assert isinstance(failed, JobFailed)
    assert failed.failure_class is FailureClass.USER_ERROR
    assert failed.attempt == 2
    assert failed.exit_code == 2
    assert "budget spent (1 of 1)" in failed.reason
    record = await harness.job("alice", "j1")
    assert record.terminal is JobState.FAILED
    assert [d.outcome for d in record.decisions] == ["retried", "failed"]


async def test_out_of_memory_is_its_own_class(harness: Harness) -> None:
    await harness.send(started("j2"))
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    await harness.send(exited("j2", exit_code=1, stderr=oom))
    (retry,) = await harness.outputs(JobRetried)
    assert isinstance(retry, JobRetried)
    assert retry.failure_class is FailureClass.OUT_OF_MEMORY
    await harness.send(started("j2", attempt=2))
    await harness.send(exited("j2", attempt=2, exit_code=1, stderr=oom))
    (failed,) = await harness.outputs(JobFailed)
    assert isinstance(failed, JobFailed)
    assert failed.failure_class is FailureClass.OUT_OF_MEMORY


async def test_infrastructure_failure_resumes_from_the_last_checkpoint(harness: Harness) -> None:
    await harness.send(registered("n1"))
    await harness.send(started("j3"))
    await harness.send(
        JobCheckpointed(
            user="alice", job_id="j3", node_id="n1", attempt=1, step=40, path="/ckpt/alice/j3/1"
        )
    )
    await harness.send(exited("j3", exit_code=None, signal=9, xids=(79,)))
    (retry,) = await harness.outputs(JobRetried)
    assert isinstance(retry, JobRetried)
    assert retry.failure_class is FailureClass.INFRASTRUCTURE
    assert retry.resume_from_step == 40
    assert "XID 79" in retry.reason
    assert "another node" in retry.reason
    node = await harness.node("n1")
    assert node.failure_counts == {FailureClass.INFRASTRUCTURE: 1}
    assert node.recent_failures[0].job_id == "j3"
    assert not node.quarantined


async def test_success_completes_and_later_exits_are_ignored(harness: Harness) -> None:
    harness.clock.at(0.0)
    await harness.send(started("j4"))
    await harness.send(
        JobProgress(
            user="alice",
            job_id="j4",
            node_id="n1",
            generation="v100",
            attempt=1,
            minibatches_per_s=3.0,
            iterations=500,
        )
    )
    harness.clock.at(90.0)
    await harness.send(exited("j4", exit_code=0))
    (completed,) = await harness.outputs(JobCompleted)
    assert isinstance(completed, JobCompleted)
    assert completed.iterations == 500
    assert completed.runtime_s == pytest.approx(90.0)
    await harness.send(exited("j4", exit_code=1))
    assert await harness.outputs(JobRetried, JobFailed) == []
    assert (await harness.job("alice", "j4")).terminal is JobState.COMPLETED


async def test_the_submissions_max_retries_caps_every_class(harness: Harness) -> None:
    await harness.send(
        JobSubmitted(user="carol", job_id="j5", gpus=1, command=("x",), max_retries=0)
    )
    await harness.send(started("j5", user="carol"))
    await harness.send(exited("j5", user="carol", exit_code=None, signal=9))
    (failed,) = await harness.outputs(JobFailed)
    assert isinstance(failed, JobFailed)
    assert failed.failure_class is FailureClass.INFRASTRUCTURE
    assert "max_retries (0)" in failed.reason


async def test_cancelled_job_exit_is_not_decided(harness: Harness) -> None:
    await harness.send(started("j6"))
    await harness.send(JobCancelled(user="alice", job_id="j6", previous_state=JobState.RUNNING))
    await harness.send(exited("j6", exit_code=None, signal=15))
    assert await harness.outputs(JobRetried, JobFailed, JobCompleted) == []


async def test_a_redelivered_exit_decides_once(harness: Harness) -> None:
    await harness.send(started("j8"))
    envelope = await harness.send(exited("j8", exit_code=3))
    # As a redelivery after a crash between publishing and acknowledging would.
    data = JobExited.model_validate(envelope.data)
    await harness.detector.on_job_event(envelope, data)
    assert len(await harness.outputs(JobRetried)) == 1
    assert (await harness.job("alice", "j8")).retries == {FailureClass.USER_ERROR: 1}


# ----- quarantine -----------------------------------------------------------------------------


async def test_node_failing_jobs_is_quarantined_until_uncordoned(harness: Harness) -> None:
    await harness.send(registered("n1"))
    for index in range(3):
        harness.clock.at(60.0 * index)
        job_id = f"q{index}"
        await harness.send(started(job_id))
        await harness.send(exited(job_id, exit_code=1, stderr="NCCL error: unhandled system error"))
    (quarantined,) = await harness.outputs(NodeQuarantined)
    assert isinstance(quarantined, NodeQuarantined)
    assert quarantined.recent_failures == 3
    record = await harness.node("n1")
    assert record.quarantined and record.state is NodeState.QUARANTINED
    assert not record.schedulable

    # An executor restart re-registers it: still quarantined, and said so again.
    await harness.send(registered("n1"))
    assert len(await harness.outputs(NodeQuarantined)) == 2
    assert (await harness.node("n1")).state is NodeState.QUARANTINED

    # User errors say nothing about the node.
    await harness.send(started("u1"))
    await harness.send(exited("u1", exit_code=1, stderr="KeyError: 'lr'"))
    assert (await harness.node("n1")).failure_counts == {FailureClass.INFRASTRUCTURE: 3}

    await harness.send(NodeUncordoned(node_id="n1", operator="ops", reason="replaced the NIC"))
    record = await harness.node("n1")
    assert not record.quarantined and record.state is NodeState.READY
    assert record.uncordoned_by == "ops"
    assert record.recent_failures == ()

    # Failures before the uncordon no longer count: one more does not quarantine it again.
    await harness.send(started("q9"))
    await harness.send(exited("q9", exit_code=None, signal=9))
    assert len(await harness.outputs(NodeQuarantined)) == 2


async def test_uncordon_of_a_failed_node_keeps_it_failed(harness: Harness) -> None:
    await harness.send(registered("n1"))
    for index in range(3):
        await harness.send(started(f"q{index}"))
        await harness.send(exited(f"q{index}", exit_code=None, xids=(48,), signal=9))
    await harness.check(100.0)
    assert (await harness.node("n1")).state is NodeState.FAILED
    await harness.send(NodeUncordoned(node_id="n1", operator="ops"))
    record = await harness.node("n1")
    assert not record.quarantined
    assert record.state is NodeState.FAILED
    # Consumers read "uncordoned" as ready: the detector restates that it is failed.
    assert len(await harness.outputs(NodeFailed)) == 2


# ----- hung jobs ------------------------------------------------------------------------------


async def test_job_without_progress_is_killed_and_retried(harness: Harness) -> None:
    harness.clock.at(0.0)
    await harness.send(started("h1"))
    for second in (30.0, 60.0):
        harness.clock.at(second)
        await harness.send(
            JobProgress(
                user="alice",
                job_id="h1",
                node_id="n1",
                generation="v100",
                attempt=1,
                minibatches_per_s=1.0,
                iterations=int(second),
                checkpoint_step=20,
            )
        )
    await harness.check(60.0 + 119.0)
    assert await harness.outputs(KillCommand) == []
    await harness.check(60.0 + 121.0)
    (kill,) = await harness.outputs(KillCommand)
    assert isinstance(kill, KillCommand)
    assert (kill.node_id, kill.job_id, kill.attempt) == ("n1", "h1", 1)
    (retry,) = await harness.outputs(JobRetried)
    assert isinstance(retry, JobRetried)
    assert retry.attempt == 2
    assert retry.failure_class is FailureClass.INFRASTRUCTURE
    assert retry.resume_from_step == 20
    assert "no progress for 121s" in retry.reason
    # Not hung twice; and a suspended job is not hung at all.
    await harness.check(1000.0)
    assert len(await harness.outputs(KillCommand)) == 1
    await harness.send(started("h2"))
    await harness.send(
        JobSuspended(
            user="alice", job_id="h2", node_id="n1", attempt=1, reason=SuspendReason.TIME_SLICE
        )
    )
    await harness.check(5000.0)
    assert len(await harness.outputs(KillCommand)) == 1


# ----- restart ---------------------------------------------------------------------------------


async def test_restart_keeps_retry_budgets_and_node_states(
    bus: InMemoryBus, clock: FakeClock
) -> None:
    first = ObservedDetector(settings(), clock=clock)
    async with ServiceRuntime(first.service, bus, settings=FAST):
        harness = Harness(bus, clock, first)
        await harness.send(registered("n1"))
        await harness.send(started("r1"))
        await harness.send(exited("r1", exit_code=1))
        await harness.check(30.0)
        assert (await harness.node("n1")).state is NodeState.SUSPECTED

    second = ObservedDetector(settings(), clock=clock)
    async with ServiceRuntime(second.service, bus, settings=FAST):
        harness = Harness(bus, clock, second)
        assert second.nodes.get("n1") is not None
        assert second.nodes.get("n1").state is NodeState.SUSPECTED  # type: ignore[union-attr]
        # The restart grants a fresh grace period instead of failing it on the spot.
        await harness.check(40.0)
        assert await harness.outputs(NodeFailed) == []
        await harness.send(started("r1", attempt=2))
        await harness.send(exited("r1", attempt=2, exit_code=1))
        (failed,) = await harness.outputs(JobFailed)
        assert isinstance(failed, JobFailed)
        assert failed.failure_class is FailureClass.USER_ERROR


# ----- retention -------------------------------------------------------------------------------


async def test_records_of_ended_jobs_are_purged_after_the_retention(
    bus: InMemoryBus, clock: FakeClock
) -> None:
    first = ObservedDetector(settings(job_retention_s=3600.0), clock=clock)
    async with ServiceRuntime(first.service, bus, settings=FAST):
        harness = Harness(bus, clock, first)
        for job_id in ("done", "gone", "live"):
            await harness.send(started(job_id))
        harness.clock.at(10.0)
        await harness.send(exited("done", exit_code=0))
        harness.clock.at(20.0)
        await harness.send(
            JobCancelled(user="alice", job_id="gone", previous_state=JobState.RUNNING)
        )
        assert (await harness.job("alice", "gone")).ended_at == T0 + timedelta(seconds=20)
        kv = await bus.key_value(FAILURES.name)
        harness.clock.at(10.0 + 3601.0)
        await first.purge()
        assert sorted(await kv.keys()) == ["alice.gone", "alice.live"]

    # A restarted detector knows from the records when each job ended.
    second = ObservedDetector(settings(job_retention_s=3600.0), clock=clock)
    async with ServiceRuntime(second.service, bus, settings=FAST):
        harness = Harness(bus, clock, second)
        harness.clock.at(20.0 + 3601.0)
        await second.purge()
        assert await kv.keys() == ["alice.live"]
        assert (await harness.job("alice", "live")).terminal is None


async def test_a_node_that_reports_a_fault_is_failed_until_it_reports_none(
    harness: Harness,
) -> None:
    # Its container engine does not answer: alive, but its jobs are re-placed.
    job = JobRef(user="alice", job_id="j1")
    await harness.send(registered("n1"))
    await harness.send(started("j1", "n1"))
    fault = "the container engine is unreachable: no such file"
    await harness.send(NodeHeartbeat(node_id="n1", seq=1, running=(job,), fault=fault))
    (failed,) = await harness.outputs(NodeFailed)
    assert isinstance(failed, NodeFailed)
    assert failed.jobs == (job,) and fault in failed.reason
    assert (await harness.node("n1")).state is NodeState.FAILED
    assert (await harness.job("alice", "j1")).decisions[-1].outcome == "node_lost"
    # Still faulty: still failed, said once.
    harness.clock.at(5.0)
    await harness.send(NodeHeartbeat(node_id="n1", seq=2, fault=fault))
    assert len(await harness.outputs(NodeFailed)) == 1
    assert await harness.outputs(NodeRecovered) == []
    harness.clock.at(10.0)
    await harness.send(heartbeat("n1", 3))
    (recovered,) = await harness.outputs(NodeRecovered)
    assert (
        isinstance(recovered, NodeRecovered) and recovered.reason == "it reports no fault any more"
    )
    assert (await harness.node("n1")).state is NodeState.READY
