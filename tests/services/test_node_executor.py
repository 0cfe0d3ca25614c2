"""The node executor: commands in, job processes run, job and node events out.

Most tests run on the in-memory bus with simulated GPUs and tiny job processes; the ones
marked `nats` run the executor on a real nats-server, one of them as its own process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gfair.bus.dead_letter import DeadLetter, DeadLetterReason
from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.publisher import EventPublisher
from gfair.bus.runner import RunnerSettings
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.server import EmbeddedNatsServer
from gfair.bus.topology import DEAD_LETTER_STREAM
from gfair.bus.transport import Bus
from gfair.events.commands import (
    KillCommand,
    MigrateCommand,
    PrepareCommand,
    ResumeCommand,
    StartCommand,
    SuspendCommand,
)
from gfair.events.envelope import Envelope, EventData
from gfair.events.fields import JobRef
from gfair.events.jobs import (
    JobCheckpointed,
    JobExited,
    JobMigrated,
    JobProgress,
    JobResumed,
    JobStarted,
    JobSuspended,
)
from gfair.events.nodes import NodeHeartbeat, NodeRegistered, NodeTelemetry
from gfair.events.reasons import MigrationReason, SuspendReason
from gfair.node.job_cgroup import AUTO, locate
from gfair.node.job_limits import JobLimits, LimitError, check_host
from gfair.node.run_directory import RunDirectory
from gfair.node.simulated import SimulatedGpus
from gfair.sdk.environment import ENV_CONTROL_DIR
from gfair_services.node_executor import CANNOT_START_EXIT_CODE, NodeExecutor, Settings
from gfair_services.node_executor.executor import COMMANDS_IN_FLIGHT
from gfair_services.topology import cluster_topology
from node.helpers import JOB_PYTHON, reachable_tmp, sdk_on_pythonpath
from support.waiting import consistently, eventually

# As root, jobs run as their tenants' own uids: they need directories and a Python those reach
# (tests/node/helpers.py).
tmp_path = pytest.fixture(name="tmp_path")(reachable_tmp)
sdk_for_jobs = pytest.fixture(autouse=True)(sdk_on_pythonpath)

# Commands in flight as the executor's own runtime has them (`COMMANDS_IN_FLIGHT`).
FAST = RunnerSettings(batch=COMMANDS_IN_FLIGHT, fetch_timeout_s=0.02, error_pause_s=0.02)
NODE = "n1"
SYNTHETIC = (JOB_PYTHON, "-m", "gfair.sdk.synthetic", "--job-type", "ResNet-50 (batch size 32)")
# A process that ignores yield requests: it only stops when signalled.
SLEEPER = (JOB_PYTHON, "-c", "import time; time.sleep(120)")
# Trains a few mini-batches (it came up), then ignores its yields and SIGTERM.
STUBBORN = (JOB_PYTHON, str(Path(__file__).parents[1] / "node" / "yield_ignoring_job.py"))
JOB_EVENTS = (JobStarted, JobResumed, JobProgress, JobCheckpointed, JobSuspended, JobMigrated)


def make_settings(tmp_path: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "node_id": NODE,
        "simulate_gpus": "v100:2,k80:1",
        "checkpoint_root": tmp_path / "checkpoints",
        "work_root": tmp_path / "work",
        # The tests call the timers themselves.
        "heartbeat_s": 3600.0,
        "telemetry_s": 3600.0,
        "suspend_timeout_s": 0.5,
        "term_grace_s": 0.5,
        "progress_interval_s": 0.2,
    } | overrides
    return Settings(**values)  # type: ignore[arg-type]


def start_command(
    tmp_path: Path,
    job_id: str,
    argv: tuple[str, ...],
    gpus: tuple[int, ...] = (0,),
    *,
    attempt: int = 1,
    user: str = "alice",
) -> StartCommand:
    return StartCommand(
        node_id=NODE,
        user=user,
        job_id=job_id,
        attempt=attempt,
        command=argv,
        gpu_indices=gpus,
        checkpoint_dir=str(tmp_path / "checkpoints" / user / job_id),
    )


class Node:
    """An executor on a bus, and the scheduler's side of the conversation with it."""

    def __init__(self, bus: Bus, executor: NodeExecutor, gpus: SimulatedGpus) -> None:
        self.bus = bus
        self.executor = executor
        self.gpus = gpus
        self.scheduler = EventPublisher(bus, "split-stride")

    async def send(self, command: EventData, *, time_: datetime | None = None) -> Envelope:
        envelope = Envelope.wrap(command, source="split-stride", time=time_)
        await self.scheduler.publish_envelope(envelope)
        return envelope

    async def envelopes(self, *types: type[EventData]) -> list[Envelope]:
        """What the executor published so far, of `types`, in stream order (stream by stream)."""
        wanted = {t.EVENT_TYPE for t in types}
        found: list[Envelope] = []
        for stream in ("GFAIR_JOBS", "GFAIR_NODES"):
            async for message in self.bus.history(stream):
                envelope = Envelope.model_validate_json(message.data)
                if envelope.source == "node-executor" and envelope.type in wanted:
                    found.append(envelope)
        return found

    async def events(self, *types: type[EventData], job_id: str | None = None) -> list[EventData]:
        models = {t.EVENT_TYPE: t for t in types}
        found: list[EventData] = []
        for envelope in await self.envelopes(*types):
            data = models[envelope.type].model_validate(envelope.data)
            if job_id is None or getattr(data, "job_id", None) == job_id:
                found.append(data)
        return found

    async def wait_for(
        self,
        kind: type[EventData],
        *,
        job_id: str | None = None,
        count: int = 1,
        timeout_s: float = 20.0,
    ) -> list[EventData]:
        async def enough() -> list[EventData] | None:
            found = await self.events(kind, job_id=job_id)
            return found if len(found) >= count else None

        return await eventually(enough, timeout_s, what=f"{count} x {kind.__name__}")

    async def dead_letters(self) -> list[DeadLetter]:
        return [
            DeadLetter.model_validate_json(m.data)
            async for m in self.bus.history(DEAD_LETTER_STREAM)
        ]


def executor_process(
    nats_server: EmbeddedNatsServer, tmp_path: Path, *flags: str, **options: object
) -> subprocess.Popen[bytes]:
    """A node executor as its own process (`NODE`, two simulated V100s), for signal tests."""
    argv = [sys.executable, "-m", "gfair_services.node_executor", "--node-id", NODE]
    argv += ["--simulate-gpus", "v100:2", "--checkpoint-root", str(tmp_path / "checkpoints")]
    argv += ["--work-root", str(tmp_path / "work"), *flags]
    env = {**os.environ, "GFAIR_NATS_URL": nats_server.url, "GFAIR_LOG_LEVEL": "WARNING"}
    return spawn(argv, env=env, stdout=subprocess.DEVNULL, **options)


def spawn(argv: Sequence[str], **options: object) -> subprocess.Popen[bytes]:
    # Starting a process takes a fork and an exec: fine for a test to do inline.
    return subprocess.Popen(argv, **options)  # type: ignore[call-overload,no-any-return]


# How long a test watches for something that must not happen: the executor acts on a command
# within milliseconds.
QUIET_S = 0.3


async def _count_at_least(found: Awaitable[Sequence[object]], count: int) -> bool:
    return len(await found) >= count


async def exactly(found: Awaitable[Sequence[object]], count: int) -> bool:
    return len(await found) == count


async def _now(value: bool) -> bool:
    return value


@pytest.fixture
async def memory_bus() -> AsyncIterator[InMemoryBus]:
    bus = InMemoryBus()
    try:
        yield bus
    finally:
        await bus.close()


@pytest.fixture
def gpus() -> SimulatedGpus:
    return SimulatedGpus("v100:2,k80:1", node_id=NODE)


async def running_node(bus: Bus, settings: Settings, gpus: SimulatedGpus) -> AsyncIterator[Node]:
    executor = NodeExecutor(settings, gpus=gpus)
    runtime = ServiceRuntime(executor.service, bus, settings=FAST)
    await runtime.start()
    try:
        yield Node(bus, executor, gpus)
    finally:
        await runtime.stop()
        await executor.close()


@pytest.fixture
async def node(memory_bus: InMemoryBus, tmp_path: Path, gpus: SimulatedGpus) -> AsyncIterator[Node]:
    async for started in running_node(memory_bus, make_settings(tmp_path), gpus):
        yield started


# ----- registration, heartbeats, telemetry ----------------------------------------------------


async def test_registers_its_gpus_and_heartbeats_its_jobs(node: Node, tmp_path: Path) -> None:
    (registered,) = await node.events(NodeRegistered)
    assert isinstance(registered, NodeRegistered)
    assert [(g.index, g.generation) for g in registered.gpus] == [
        (0, "v100"),
        (1, "v100"),
        (2, "k80"),
    ]
    assert registered.simulated
    assert registered.heartbeat_interval_s == 3600.0

    (first,) = [e.data for e in await node.executor.heartbeat()]
    assert isinstance(first, NodeHeartbeat)
    assert (first.seq, first.running, first.fault) == (0, (), None)
    await node.send(start_command(tmp_path, "sleepy", SLEEPER, (1,)))
    await node.wait_for(JobStarted)
    (second,) = [e.data for e in await node.executor.heartbeat()]
    assert isinstance(second, NodeHeartbeat)
    assert (second.seq, second.running) == (1, (JobRef(user="alice", job_id="sleepy"),))


async def test_telemetry_follows_busy_gpus_and_reports_xids_once(
    node: Node, tmp_path: Path
) -> None:
    await node.send(start_command(tmp_path, "busy", SLEEPER, (1,)))
    await node.wait_for(JobStarted)
    node.gpus.inject_xid(2, 79)
    (emit,) = await node.executor.telemetry()
    telemetry = emit.data
    assert isinstance(telemetry, NodeTelemetry)
    by_index = {sample.index: sample for sample in telemetry.gpus}
    assert by_index[1].utilization_pct > 90 and by_index[0].utilization_pct == 0
    assert by_index[2].xid_events == (79,)
    (again,) = await node.executor.telemetry()
    assert isinstance(again.data, NodeTelemetry)
    assert all(sample.xid_events == () for sample in again.data.gpus)


# ----- starting -------------------------------------------------------------------------------


async def test_a_repeated_start_is_a_no_op(node: Node, tmp_path: Path) -> None:
    command = start_command(tmp_path, "once", SLEEPER, (0,))
    first = await node.send(command)
    await node.wait_for(JobStarted)
    await node.send(command)  # the scheduler says it again
    # A redelivery of the very command that started it announces it again, under the same id.
    await node.executor.on_command(first, command)
    await consistently(
        lambda: len(node.executor.running()) == 1 and exactly(node.events(JobStarted), 1), QUIET_S
    )


async def test_commands_on_other_gpus_run_beside_a_slow_suspend_and_a_start_waits_for_its_gpus(
    node: Node, tmp_path: Path
) -> None:
    # A job that ignores its yield holds its GPU until the grace runs out and it is killed.
    await node.send(start_command(tmp_path, "stubborn", STUBBORN, (0,)))
    await node.wait_for(JobProgress, job_id="stubborn")  # it came up
    await node.send(
        SuspendCommand(node_id=NODE, user="alice", job_id="stubborn", attempt=1, yield_grace_s=2)
    )
    await node.send(start_command(tmp_path, "beside", SLEEPER, (1,)))  # another GPU
    await node.send(start_command(tmp_path, "after", SLEEPER, (0,)))  # the stubborn one's GPU
    await node.wait_for(JobStarted, job_id="after", timeout_s=30.0)
    order = [
        (type(event).__name__, getattr(event, "job_id", ""))
        for event in await node.events(JobStarted, JobSuspended)
    ]
    assert order.index(("JobStarted", "beside")) < order.index(("JobSuspended", "stubborn"))
    assert order.index(("JobSuspended", "stubborn")) < order.index(("JobStarted", "after"))
    assert {run.job.job_id for run in node.executor.running()} == {"beside", "after"}


async def test_program_that_cannot_start_is_reported_as_exited(node: Node, tmp_path: Path) -> None:
    await node.send(start_command(tmp_path, "typo", ("/no/such/trainer", "--lr", "0.1")))
    (exited,) = await node.wait_for(JobExited)
    assert isinstance(exited, JobExited)
    assert exited.exit_code == CANNOT_START_EXIT_CODE
    assert "/no/such/trainer" in exited.stderr_tail
    assert await node.events(JobStarted) == []


async def test_impossible_starts_are_dead_lettered_with_the_reason(
    node: Node, tmp_path: Path
) -> None:
    await node.send(start_command(tmp_path, "ghost-gpu", SLEEPER, (7,)))
    await node.send(start_command(tmp_path, "mixed", SLEEPER, (1, 2)))
    wrong_dir = start_command(tmp_path, "elsewhere", SLEEPER).model_copy(
        update={"checkpoint_dir": "/somewhere/else/alice/elsewhere"}
    )
    await node.send(wrong_dir)
    await eventually(lambda: _count_at_least(node.dead_letters(), 3))
    letters = await node.dead_letters()
    assert [letter.reason for letter in letters] == [DeadLetterReason.REJECTED] * 3
    assert "has no GPU [7]" in letters[0].error
    assert "mix generations" in letters[1].error
    assert "checkpoint root" in letters[2].error
    assert node.executor.running() == []


async def test_stale_start_is_ignored(node: Node, tmp_path: Path) -> None:
    old = datetime.now(UTC) - timedelta(minutes=10)
    await node.send(start_command(tmp_path, "late", SLEEPER), time_=old)
    await consistently(
        lambda: node.executor.running() == [] and exactly(node.events(JobStarted, JobExited), 0),
        QUIET_S,
    )


async def test_a_start_past_its_valid_until_is_refused_and_a_fresh_one_runs(
    node: Node, tmp_path: Path
) -> None:
    # Judged from the command alone: past its `valid_until` the scheduler may have forgotten
    # it and started the job elsewhere. One without (an older scheduler's) stands.
    now = datetime.now(UTC)
    for job_id, gpu, valid_until in (
        ("forgotten", 0, now - timedelta(seconds=1)),
        ("fresh", 1, now + timedelta(minutes=1)),
        ("unbounded", 0, None),
    ):
        command = start_command(tmp_path, job_id, SLEEPER, (gpu,))
        await node.send(command.model_copy(update={"valid_until": valid_until}))
    await node.wait_for(JobStarted, count=2)
    await consistently(lambda: exactly(node.events(JobStarted), 2), QUIET_S)
    started = await node.events(JobStarted)
    assert sorted(getattr(e, "job_id", "") for e in started) == ["fresh", "unbounded"]
    assert sorted(run.job.job_id for run in node.executor.running()) == ["fresh", "unbounded"]


async def test_a_start_of_an_attempt_that_ended_here_is_ignored(node: Node, tmp_path: Path) -> None:
    # The scheduler's start can cross the job's exit (more so while a broker fails over and the
    # job's record trails): the finished job must not run again. A retry is a newer attempt.
    quick = (JOB_PYTHON, "-c", "pass")
    await node.send(start_command(tmp_path, "done", quick, (0,)))
    await node.wait_for(JobExited)
    await node.send(start_command(tmp_path, "done", quick, (1,)))
    await node.send(
        ResumeCommand(node_id=NODE, user="alice", job_id="done", attempt=1, gpu_indices=(0,))
    )
    await consistently(lambda: exactly(node.events(JobStarted, JobResumed), 1), QUIET_S)
    await node.send(start_command(tmp_path, "done", quick, (1,), attempt=2))
    started = await node.wait_for(JobStarted, count=2)
    assert [getattr(e, "attempt", None) for e in started] == [1, 2]


async def test_start_on_gpus_still_held_suspends_the_holder_first(
    node: Node, tmp_path: Path
) -> None:
    await node.send(start_command(tmp_path, "holder", SLEEPER, (0,), user="bob"))
    await node.wait_for(JobStarted, job_id="holder")
    await node.send(start_command(tmp_path, "newcomer", SLEEPER, (0,)))
    await node.wait_for(JobStarted, job_id="newcomer")
    events = await node.events(JobStarted, JobSuspended)
    assert [(type(e).__name__, getattr(e, "job_id", "")) for e in events] == [
        ("JobStarted", "holder"),
        ("JobSuspended", "holder"),
        ("JobStarted", "newcomer"),
    ]
    assert [job.job.job_id for job in node.executor.running()] == ["newcomer"]


# ----- stopping -------------------------------------------------------------------------------


async def test_crash_is_reported_with_stderr_and_xids(node: Node, tmp_path: Path) -> None:
    crash = (
        JOB_PYTHON,
        "-c",
        "import sys, time; time.sleep(0.5); sys.stderr.write('Xid 79: fallen off the bus\\n');"
        " sys.exit(3)",
    )
    await node.send(start_command(tmp_path, "crashy", crash, (1,)))
    await node.wait_for(JobStarted)
    node.gpus.inject_xid(1, 79)  # on its GPU
    node.gpus.inject_xid(0, 48)  # on another job's GPU: not its business
    (exited,) = await node.wait_for(JobExited)
    assert isinstance(exited, JobExited)
    assert (exited.exit_code, exited.signal, exited.attempt) == (3, None, 1)
    assert "fallen off the bus" in exited.stderr_tail
    assert exited.xid_errors == (79,)
    assert exited.runtime_s >= 0.4
    assert node.executor.running() == []


def _enforces(limits: JobLimits) -> bool:
    try:
        check_host(limits, locate(AUTO))
    except LimitError:
        return False
    return True


@pytest.mark.skipif(
    not _enforces(JobLimits(memory_per_gpu=48 << 20)), reason="no memory controller on this host"
)
async def test_a_job_over_the_nodes_memory_per_gpu_exits_as_out_of_memory(
    memory_bus: InMemoryBus, tmp_path: Path, gpus: SimulatedGpus
) -> None:
    # 48 MiB per GPU, two GPUs: 96 MiB; the job touches 256 MiB.
    greedy = (
        JOB_PYTHON,
        "-c",
        "b = bytearray(256 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1",
    )
    settings = make_settings(tmp_path, job_memory_per_gpu="48M")
    async for node in running_node(memory_bus, settings, gpus):
        await node.send(start_command(tmp_path, "greedy", greedy, (0, 1)))
        (exited,) = await node.wait_for(JobExited)
        assert isinstance(exited, JobExited)
        assert exited.signal == signal.SIGKILL
        assert "over its memory limit of 0.0938 GiB" in exited.stderr_tail


async def test_kill_stops_the_job_without_reporting_an_exit(node: Node, tmp_path: Path) -> None:
    await node.send(start_command(tmp_path, "hung", SLEEPER, (0,)))
    await node.wait_for(JobStarted)
    await node.send(
        KillCommand(node_id=NODE, user="alice", job_id="hung", attempt=1, reason="no progress")
    )
    await eventually(lambda: _now(not node.executor.running()))
    await consistently(
        lambda: node.executor.running() == [] and exactly(node.events(JobExited, JobSuspended), 0),
        QUIET_S,
    )


async def test_a_fence_kills_only_a_copy_older_than_the_start_it_names(
    node: Node, tmp_path: Path
) -> None:
    await node.send(start_command(tmp_path, "moved", SLEEPER, (0,)))
    await node.wait_for(JobStarted)
    started = node.executor.running()[0].started_at

    def fence(elsewhere_since: float) -> KillCommand:
        return KillCommand(
            node_id=NODE,
            user="alice",
            job_id="moved",
            attempt=1,
            reason="the job runs on n2",
            started_before=datetime.fromtimestamp(elsewhere_since, UTC),
        )

    # The sender heard of a start elsewhere from before this run: this run is the newer one.
    await node.send(fence(started - 5.0))
    await consistently(
        lambda: [run.job.job_id for run in node.executor.running()] == ["moved"], QUIET_S
    )
    # A start elsewhere after this run began: this is a copy left behind.
    await node.send(fence(started + 5.0))
    await eventually(lambda: _now(not node.executor.running()))


async def test_stops_of_jobs_not_here_are_answered_and_change_nothing(
    node: Node, tmp_path: Path
) -> None:
    # (As after a restart of this executor: what its predecessor stopped, it never heard of.)
    for command in (
        SuspendCommand(node_id=NODE, user="alice", job_id="nobody", attempt=1),
        KillCommand(node_id=NODE, user="alice", job_id="nobody", attempt=1, reason="x"),
        MigrateCommand(
            node_id=NODE,
            user="alice",
            job_id="nobody",
            attempt=1,
            to_node="n2",
            reason=MigrationReason.LOAD_BALANCE,
        ),
    ):
        await node.send(command)
    await node.send(
        ResumeCommand(node_id=NODE, user="alice", job_id="nobody", attempt=1, gpu_indices=(0,))
    )
    await eventually(lambda: _count_at_least(node.dead_letters(), 1))
    (letter,) = await node.dead_letters()
    assert "never started" in letter.error
    suspended, migrated = await node.events(*JOB_EVENTS, JobExited)
    assert isinstance(suspended, JobSuspended) and isinstance(migrated, JobMigrated)
    assert (suspended.node_id, suspended.attempt, suspended.checkpoint_step) == (NODE, 1, None)
    assert (migrated.from_node, migrated.to_node, migrated.checkpoint_step) == (NODE, "n2", None)
    assert node.executor.runs() == []


async def test_a_second_suspend_of_a_suspended_job_is_answered_again(
    node: Node, tmp_path: Path
) -> None:
    await node.send(start_command(tmp_path, "twice", SYNTHETIC))
    await node.wait_for(JobProgress, job_id="twice")
    move = SuspendReason.MIGRATION  # (not a time slice: it checkpoints and exits, no park)
    await node.send(
        SuspendCommand(node_id=NODE, user="alice", job_id="twice", attempt=1, reason=move)
    )
    (first,) = await node.wait_for(JobSuspended, job_id="twice")
    # A scheduler restored from an older record stops it again: unanswered, the job could run
    # nowhere until the scheduler gave up waiting.
    await node.send(
        SuspendCommand(node_id=NODE, user="alice", job_id="twice", attempt=1, reason=move)
    )
    _, again = await node.wait_for(JobSuspended, job_id="twice", count=2)
    assert isinstance(first, JobSuspended) and isinstance(again, JobSuspended)
    assert again.checkpoint_step == first.checkpoint_step and not again.in_place
    assert node.executor.running() == []


async def test_commands_of_an_earlier_attempt_are_ignored(node: Node, tmp_path: Path) -> None:
    await node.send(start_command(tmp_path, "retried", SLEEPER, (0,), attempt=2))
    await node.wait_for(JobStarted)
    await node.send(SuspendCommand(node_id=NODE, user="alice", job_id="retried", attempt=1))
    await node.send(start_command(tmp_path, "retried", SLEEPER, (1,), attempt=1))
    await consistently(lambda: exactly(node.events(JobStarted, JobSuspended), 1), QUIET_S)
    (job,) = node.executor.running()
    assert (job.attempt, job.gpu_indices) == (2, (0,))


async def test_a_job_still_coming_up_is_frozen_at_its_slices_end_and_goes_on_at_its_next(
    node: Node, tmp_path: Path
) -> None:
    # The sleeper never reports a mini-batch: it has nothing to yield with, and no GPU memory
    # (simulated GPUs), so it is frozen where it is instead of killed at the grace's end.
    await node.send(start_command(tmp_path, "sliced", SLEEPER, (0,)))
    await node.wait_for(JobStarted)
    (process,) = node.executor.runs()
    suspend = SuspendCommand(node_id=NODE, user="alice", job_id="sliced", attempt=1)
    first = await node.send(suspend)
    (suspended,) = await node.wait_for(JobSuspended)
    assert isinstance(suspended, JobSuspended)
    assert suspended.in_place and not suspended.forced
    assert suspended.duration_s is not None and suspended.duration_s < 1.0
    await node.executor.on_command(first, suspend)  # a redelivery restates, under the same id
    assert len(await node.events(JobSuspended)) == 1

    await node.send(
        ResumeCommand(node_id=NODE, user="alice", job_id="sliced", attempt=1, gpu_indices=(1,))
    )
    (resumed,) = await node.wait_for(JobResumed)
    assert isinstance(resumed, JobResumed) and resumed.in_place
    assert resumed.gpu_indices == (1,)
    (run,) = node.executor.running()
    assert run.gpu_indices == (1,) and run.alive and run is process  # the same process
    assert len(await node.events(JobStarted)) == 1


async def test_migrate_checkpoints_and_announces_the_move(node: Node, tmp_path: Path) -> None:
    await node.send(start_command(tmp_path, "mover", SLEEPER, (0,)))
    await node.wait_for(JobStarted)
    await node.send(
        MigrateCommand(
            node_id=NODE,
            user="alice",
            job_id="mover",
            attempt=1,
            to_node="n2",
            reason=MigrationReason.LOAD_BALANCE,
        )
    )
    (migrated,) = await node.wait_for(JobMigrated)
    assert isinstance(migrated, JobMigrated)
    assert (migrated.from_node, migrated.to_node, migrated.attempt) == (NODE, "n2", 1)
    # The job did not yield by itself: it was stopped, which is still the stop that was asked.
    assert await node.events(JobExited, JobSuspended) == []
    assert node.executor.running() == []


async def test_close_drains_every_job(
    memory_bus: InMemoryBus, tmp_path: Path, gpus: SimulatedGpus
) -> None:
    async for node in running_node(memory_bus, make_settings(tmp_path), gpus):
        await node.send(start_command(tmp_path, "a", SLEEPER, (0,)))
        await node.send(start_command(tmp_path, "b", SLEEPER, (1,), user="bob"))
        await node.wait_for(JobStarted, count=2)
    # Leaving `running_node` stopped the runtime and closed the executor.
    drained = [e for e in await Node(memory_bus, node.executor, gpus).events(JobSuspended)]
    assert sorted((e.user, e.job_id, e.reason) for e in drained if isinstance(e, JobSuspended)) == [
        ("alice", "a", SuspendReason.DRAIN),
        ("bob", "b", SuspendReason.DRAIN),
    ]


async def test_restart_stops_orphans_and_reports_them_suspended(
    memory_bus: InMemoryBus, tmp_path: Path, gpus: SimulatedGpus
) -> None:
    settings = make_settings(tmp_path)
    # What a SIGKILLed executor leaves behind: a recorded run whose process still runs.
    run = RunDirectory.create(settings.work_dir / "runs" / "carol", "orphan")
    process = spawn(
        SLEEPER,
        start_new_session=True,
        env={**os.environ, ENV_CONTROL_DIR: str(run.control_dir)},
    )
    try:
        run.write_launch(
            {
                "node_id": NODE,
                "job_id": "orphan",
                "attempt": 3,
                "pid": process.pid,
                "pgid": process.pid,
            }
        )
        async for node in running_node(memory_bus, settings, gpus):
            (suspended,) = await node.wait_for(JobSuspended)
            assert isinstance(suspended, JobSuspended)
            assert (suspended.user, suspended.job_id, suspended.attempt) == ("carol", "orphan", 3)
            assert suspended.reason is SuspendReason.DRAIN
            assert process.wait(timeout=10) != 0
            # Registration comes first: consumers know the node before hearing about its jobs.
            (registration,) = await node.envelopes(NodeRegistered)
            (report,) = await node.envelopes(JobSuspended)
            assert registration.time <= report.time
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def test_a_restart_reports_the_ends_its_predecessor_saw_and_died_before_reporting(
    memory_bus: InMemoryBus, tmp_path: Path, gpus: SimulatedGpus
) -> None:
    settings = make_settings(tmp_path)
    ends = {
        "yielded": {"exit_code": 75, "signal": None, "yielded": True, "terminated_by": None},
        "crashed": {"exit_code": 3, "signal": None, "yielded": False, "terminated_by": None},
        "killed": {"exit_code": None, "signal": 9, "yielded": False, "terminated_by": "kill"},
    }
    for job_id, end in ends.items():
        run = RunDirectory.create(settings.work_dir / "runs" / "carol", job_id)
        run.write_launch(
            {"node_id": NODE, "job_id": job_id, "attempt": 2, "pid": 1, "pgid": 1,
             "started_at": time.time() - 30}
        )  # fmt: skip
        run.stderr.write_text("ValueError: bad batch\n")
        run.write_exit(end)
    async for node in running_node(memory_bus, settings, gpus):
        (suspended,) = await node.wait_for(JobSuspended)
        (exited,) = await node.wait_for(JobExited)
        # The kill: no one's to tell.
        await consistently(
            lambda n=node: exactly(n.events(*JOB_EVENTS, JobExited), 2),  # type: ignore[misc]
            QUIET_S,
        )
    assert isinstance(suspended, JobSuspended) and isinstance(exited, JobExited)
    assert (suspended.job_id, suspended.reason, suspended.attempt) == (
        "yielded",
        SuspendReason.DRAIN,
        2,
    )
    assert (exited.job_id, exited.exit_code, exited.attempt) == ("crashed", 3, 2)
    assert exited.stderr_tail == "ValueError: bad batch\n" and exited.runtime_s >= 29
    # Told once: the next restart has nothing to report.
    async for node in running_node(memory_bus, settings, gpus):
        await node.wait_for(NodeRegistered, count=2)
        await consistently(
            lambda n=node: exactly(n.events(*JOB_EVENTS, JobExited), 2),  # type: ignore[misc]
            QUIET_S,
        )


async def test_ends_already_reported_are_not_reported_again_after_a_restart(
    memory_bus: InMemoryBus, tmp_path: Path, gpus: SimulatedGpus
) -> None:
    settings = make_settings(tmp_path)
    async for node in running_node(memory_bus, settings, gpus):
        await node.send(start_command(tmp_path, "moved", SYNTHETIC, (0,)))
        await node.send(start_command(tmp_path, "done", (JOB_PYTHON, "-c", "pass"), (1,)))
        await node.wait_for(JobProgress, job_id="moved")
        await node.send(
            SuspendCommand(
                node_id=NODE,
                user="alice",
                job_id="moved",
                attempt=1,
                reason=SuspendReason.MIGRATION,
            )
        )
        await node.wait_for(JobSuspended, job_id="moved")
        await node.wait_for(JobExited, job_id="done")
        reported = len(await node.envelopes(JobSuspended, JobExited))
    async for node in running_node(memory_bus, settings, gpus):
        await node.wait_for(NodeRegistered, count=2)
        assert reported == 2
        await consistently(
            lambda n=node: exactly(n.envelopes(JobSuspended, JobExited), 2),  # type: ignore[misc]
            QUIET_S,
        )


# ----- on a real nats-server ------------------------------------------------------------------


async def nats_bus(server: EmbeddedNatsServer) -> Bus:
    return await NatsBus.connect(NatsOptions(servers=(server.url,)))


@pytest.mark.nats
async def test_synthetic_job_start_progress_suspend_resume_complete(
    nats_server: EmbeddedNatsServer, tmp_path: Path, gpus: SimulatedGpus
) -> None:
    bus = await nats_bus(nats_server)
    try:
        settings = make_settings(tmp_path, suspend_timeout_s=10.0)
        async for node in running_node(bus, settings, gpus):
            # 20 steps/s, 60 steps: 3 s of training with a checkpoint every 10 steps.
            argv = (
                *SYNTHETIC,
                "--iterations",
                "60",
                "--steps-per-s",
                "20",
                "--checkpoint-every",
                "10",
            )
            await node.send(start_command(tmp_path, "resnet", argv, (0, 1)))
            await node.wait_for(JobProgress, count=2)
            await node.send(SuspendCommand(node_id=NODE, user="alice", job_id="resnet", attempt=1))
            (suspended,) = await node.wait_for(JobSuspended)
            assert isinstance(suspended, JobSuspended)
            assert suspended.reason is SuspendReason.TIME_SLICE
            assert suspended.checkpoint_step is not None and 0 < suspended.checkpoint_step < 60

            await node.send(start_command(tmp_path, "resnet", argv, (0, 1)))
            (resumed,) = await node.wait_for(JobResumed)
            assert isinstance(resumed, JobResumed)
            assert resumed.checkpoint_step == suspended.checkpoint_step
            (exited,) = await node.wait_for(JobExited, timeout_s=30.0)
            assert isinstance(exited, JobExited)
            assert exited.exit_code == 0

            history = await node.events(*JOB_EVENTS, JobExited, job_id="resnet")
            kinds = [type(e).__name__ for e in history]
            suspend_at = kinds.index("JobSuspended")
            resume_at = kinds.index("JobResumed")
            assert kinds[0] == "JobStarted"
            assert "JobProgress" in kinds[1:suspend_at]
            # The yield's checkpoint is published before the suspension it made possible...
            yield_checkpoint = [
                i
                for i, e in enumerate(history[:suspend_at])
                if isinstance(e, JobCheckpointed) and e.step == suspended.checkpoint_step
            ]
            assert yield_checkpoint
            # ...nothing of the first run comes after it, and the second run starts resumed.
            assert resume_at == suspend_at + 1
            assert kinds[-1] == "JobExited"
            assert kinds.count("JobStarted") == 1 and kinds.count("JobExited") == 1
            progress = [e for e in history if isinstance(e, JobProgress)]
            assert all(p.generation == "v100" and p.minibatches_per_s > 0 for p in progress)
            after = [e for e in history[resume_at:] if isinstance(e, JobProgress)]
            assert after and min(p.iterations for p in after) >= suspended.checkpoint_step
            checkpoints = [e for e in history if isinstance(e, JobCheckpointed)]
            assert checkpoints[-1].step == 60
    finally:
        await bus.close()


@pytest.mark.nats
async def test_sigterm_drains_jobs_before_the_process_exits(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    process = executor_process(
        nats_server, tmp_path, "--suspend-timeout-s", "10", stderr=subprocess.PIPE
    )
    bus = await nats_bus(nats_server)
    try:
        await bus.ensure_topology(cluster_topology())
        node = Node(bus, executor=None, gpus=SimulatedGpus("v100:2"))  # type: ignore[arg-type]
        await node.wait_for(NodeRegistered, timeout_s=30.0)
        argv = (*SYNTHETIC, "--iterations", "100000", "--steps-per-s", "50")
        await node.send(start_command(tmp_path, "longrun", argv, (0,)))
        await node.wait_for(JobProgress, timeout_s=30.0)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 30) == 0
        (suspended,) = await node.events(JobSuspended)
        assert isinstance(suspended, JobSuspended)
        assert suspended.reason is SuspendReason.DRAIN
        assert suspended.checkpoint_step is not None and suspended.checkpoint_step > 0
        assert await node.events(JobExited) == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        await bus.close()


# ----- suspension in place ---------------------------------------------------------------------

PARKING = (
    JOB_PYTHON,
    str(Path(__file__).parents[1] / "node" / "parking_job.py"),
    "100000",
    "0.005",
)


async def test_a_time_slice_parks_in_place_and_a_start_here_continues_the_same_process(
    node: Node, tmp_path: Path
) -> None:
    await node.send(start_command(tmp_path, "p", PARKING, (0,)))
    await node.wait_for(JobProgress)
    slice_over = SuspendCommand(node_id=NODE, user="alice", job_id="p", attempt=1, yield_grace_s=5)
    first = await node.send(slice_over)
    (suspended,) = await node.wait_for(JobSuspended)
    assert isinstance(suspended, JobSuspended)
    assert suspended.in_place and not suspended.forced and suspended.duration_s is not None
    assert node.executor.running() == []  # parked: it holds no GPU
    await node.executor.on_command(first, slice_over)  # a redelivery restates it
    restated = await node.events(JobSuspended)
    assert len(restated) == 1 and isinstance(restated[0], JobSuspended) and restated[0].in_place

    # Back on this node (simulated GPUs: on any of them): the same process goes on.
    await node.send(start_command(tmp_path, "p", PARKING, (1,)))
    (resumed,) = await node.wait_for(JobResumed)
    assert isinstance(resumed, JobResumed)
    assert resumed.in_place and resumed.gpu_indices == (1,) and resumed.duration_s is not None
    (run,) = node.executor.running()
    assert run.gpu_indices == (1,)
    runs = list((tmp_path / "work" / "runs" / "alice" / "p").glob("run-*"))
    assert len(runs) == 1  # no second process
    assert await node.events(JobStarted) and len(await node.events(JobStarted)) == 1

    # Parked again, then moved away: it checkpoints where it parked and lets go.
    again = SuspendCommand(node_id=NODE, user="alice", job_id="p", attempt=1, yield_grace_s=5)
    await node.send(again)
    await node.wait_for(JobSuspended, count=2)
    move = SuspendCommand(
        node_id=NODE, user="alice", job_id="p", attempt=1, reason=SuspendReason.MIGRATION
    )
    await node.send(move)
    left = (await node.wait_for(JobSuspended, count=3))[-1]
    assert isinstance(left, JobSuspended)
    assert not left.in_place and left.checkpoint_step is not None and left.checkpoint_step > 0
    assert left.checkpoint_bytes is not None
    assert node.executor.running() == [] and await node.events(JobExited) == []


async def test_a_redelivered_start_does_not_resume_a_job_stopped_since(
    node: Node, tmp_path: Path
) -> None:
    # After a broker failover a start can come again after the suspend that followed it. The
    # scheduler may have moved the job on meanwhile (its record trailing): resuming the parked
    # process here would run it twice.
    start = start_command(tmp_path, "p", PARKING, (0,))
    first = await node.send(start)
    await node.wait_for(JobProgress)
    await node.send(
        SuspendCommand(node_id=NODE, user="alice", job_id="p", attempt=1, yield_grace_s=5)
    )
    await node.wait_for(JobSuspended)
    await node.executor.on_command(first, start)
    later = start.model_copy(update={"gpu_indices": (1,)})
    await node.executor.on_command(
        Envelope.wrap(later, source="split-stride", time=first.time), later
    )
    await consistently(
        lambda: node.executor.running() == [] and exactly(node.events(JobResumed), 0), QUIET_S
    )
    # A start sent after the suspend resumes it; so does a newer attempt's, whatever its clock.
    await node.send(start_command(tmp_path, "p", PARKING, (1,)))
    (resumed,) = await node.wait_for(JobResumed)
    assert isinstance(resumed, JobResumed) and resumed.in_place
    await node.send(
        SuspendCommand(node_id=NODE, user="alice", job_id="p", attempt=1, yield_grace_s=5)
    )
    await node.wait_for(JobSuspended, count=2)
    retry = start_command(tmp_path, "p", PARKING, (0,), attempt=2)
    await node.send(retry, time_=first.time)
    await node.wait_for(JobStarted, count=2)


async def test_a_start_in_place_suspends_another_job_still_on_its_gpus(
    node: Node, tmp_path: Path
) -> None:
    # "p" parks in place on GPU 0, "q" starts there; then a start of "p" on GPU 0 comes (one
    # sent before q's and delayed, as after a broker failover): p resumes in place only once q
    # let go of the GPU, as a cold start would.
    await node.send(start_command(tmp_path, "p", PARKING, (0,)))
    await node.wait_for(JobProgress, job_id="p")
    await node.send(
        SuspendCommand(node_id=NODE, user="alice", job_id="p", attempt=1, yield_grace_s=5)
    )
    await node.wait_for(JobSuspended, job_id="p")
    await node.send(start_command(tmp_path, "q", PARKING, (0,)))
    await node.wait_for(JobProgress, job_id="q")
    await node.send(start_command(tmp_path, "p", PARKING, (0,)))
    (resumed,) = await node.wait_for(JobResumed, job_id="p")
    assert isinstance(resumed, JobResumed) and resumed.in_place
    assert [run.job.job_id for run in node.executor.running()] == ["p"]
    kinds = [
        (e.type, e.data["job_id"])
        for e in await node.envelopes(JobSuspended, JobResumed)
        if e.data["job_id"] == "q" or e.type == JobResumed.EVENT_TYPE
    ]
    assert kinds == [(JobSuspended.EVENT_TYPE, "q"), (JobResumed.EVENT_TYPE, "p")]


async def test_a_parked_job_over_the_nodes_budget_checkpoints_and_exits(
    memory_bus: InMemoryBus, tmp_path: Path, gpus: SimulatedGpus
) -> None:
    # A budget below one Python process: whatever parks is over it at once.
    settings = make_settings(tmp_path, parked_memory="1M")
    async for node in running_node(memory_bus, settings, gpus):
        await node.send(start_command(tmp_path, "big", PARKING, (0,)))
        await node.wait_for(JobProgress)
        await node.send(
            SuspendCommand(node_id=NODE, user="alice", job_id="big", attempt=1, yield_grace_s=5)
        )
        (suspended,) = await node.wait_for(JobSuspended)
        assert isinstance(suspended, JobSuspended) and suspended.in_place
        await node.wait_for(JobCheckpointed)  # written as it left (after the park's report)
        (run,) = node.executor.runs()
        deadline = time.monotonic() + 10
        while run.alive:
            assert time.monotonic() < deadline, "the parked process over budget never exited"
            await asyncio.sleep(0.02)
        # Its next start is a new process, from that checkpoint.
        await node.send(start_command(tmp_path, "big", PARKING, (0,)))
        (resumed,) = await node.wait_for(JobResumed)
        assert isinstance(resumed, JobResumed) and not resumed.in_place
        assert resumed.checkpoint_step is not None and resumed.checkpoint_step > 0


async def test_a_job_forced_off_while_it_still_comes_up_is_reported_as_starting(
    memory_bus: InMemoryBus, tmp_path: Path, gpus: SimulatedGpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its import takes longer than the slice's grace: killed then, it would import again at
    # its next slice, and again, and never train; the report tells the scheduler so (it
    # prepares such a job's next start, gfair.core.scheduler.preparing). Killed, not frozen
    # in place: its GPUs say they hold memory (a process that made its CUDA context early).
    monkeypatch.setattr(gpus, "compute_processes", lambda indices: len(indices))
    async for node in running_node(memory_bus, make_settings(tmp_path), gpus):
        await node.send(start_command(tmp_path, "slow", prepared_job(import_s=1.5), (0,)))
        await node.wait_for(JobStarted)
        await node.send(
            SuspendCommand(node_id=NODE, user="alice", job_id="slow", attempt=1, yield_grace_s=0.2)
        )
        (suspended,) = await node.wait_for(JobSuspended, timeout_s=30.0)
        assert isinstance(suspended, JobSuspended)
        assert suspended.forced and suspended.starting and not suspended.in_place
        # Forced off in the middle of a mini-batch, past its start-up: not starting.
        slow_steps = (JOB_PYTHON, prepared_job()[1], "0", "1000", "2.0")
        await node.send(start_command(tmp_path, "steps", slow_steps, (1,)))
        await node.wait_for(JobProgress, job_id="steps", timeout_s=30.0)
        await node.send(
            SuspendCommand(node_id=NODE, user="alice", job_id="steps", attempt=1, yield_grace_s=0.2)
        )
        (later,) = await node.wait_for(JobSuspended, job_id="steps", timeout_s=30.0)
        assert isinstance(later, JobSuspended)
        assert later.forced and not later.starting


# ----- prepared starts -------------------------------------------------------------------------


def prepared_job(import_s: float = 0.0) -> tuple[str, ...]:
    job = str(Path(__file__).parents[1] / "node" / "prepared_job.py")
    return (JOB_PYTHON, job, str(import_s), "100000", "0.005")


def prepare_command(
    tmp_path: Path, job_id: str, argv: tuple[str, ...], gpus: int = 1
) -> PrepareCommand:
    return PrepareCommand(
        node_id=NODE,
        user="alice",
        job_id=job_id,
        attempt=1,
        command=argv,
        gpus=gpus,
        generation="v100",
        checkpoint_dir=str(tmp_path / "checkpoints" / "alice" / job_id),
    )


def _ended(node: Node, job_id: str) -> bool:
    """Whether the job's run here was launched and its process has gone."""
    run = node.executor.job("alice", job_id)
    return run is not None and not run.alive


def visible_devices(tmp_path: Path, job_id: str) -> list[str]:
    """What the job printed of its GPUs, in each of its runs here."""
    runs = sorted((tmp_path / "work" / "runs" / "alice" / job_id).glob("run-*"))
    return [(run / "stdout.log").read_text().strip() for run in runs]


async def test_a_prepared_start_parks_without_gpus_and_a_start_here_gives_it_them(
    node: Node, tmp_path: Path
) -> None:
    await node.send(prepare_command(tmp_path, "w", prepared_job()))
    (parked,) = await node.wait_for(JobSuspended)
    assert isinstance(parked, JobSuspended)
    assert parked.in_place and parked.reason is SuspendReason.PREPARED
    assert node.executor.running() == []  # it holds no GPU
    assert await node.events(JobStarted) == []
    (run,) = node.executor.runs()
    assert run.parked and run.gpu_indices == ()

    await node.send(start_command(tmp_path, "w", prepared_job(), (1,)))
    (resumed,) = await node.wait_for(JobResumed)
    assert isinstance(resumed, JobResumed)
    assert resumed.in_place and resumed.gpu_indices == (1,)
    await node.wait_for(JobProgress)
    (running,) = node.executor.running()
    assert running.gpu_indices == (1,)
    # One process: no device visible before Job.from_env(), the start's GPU after it.
    await eventually(lambda: _now(bool(visible_devices(tmp_path, "w")[0])))
    assert visible_devices(tmp_path, "w") == ["visible before='' after='1'"]
    assert await node.events(JobStarted) == []

    # From here on it is bound to that GPU, like any job: it parks and resumes there.
    await node.send(
        SuspendCommand(node_id=NODE, user="alice", job_id="w", attempt=1, yield_grace_s=5)
    )
    second = (await node.wait_for(JobSuspended, count=2))[-1]
    assert isinstance(second, JobSuspended) and second.in_place
    await node.send(start_command(tmp_path, "w", prepared_job(), (1,)))
    again = (await node.wait_for(JobResumed, count=2))[-1]
    assert isinstance(again, JobResumed) and again.in_place


async def test_a_start_while_a_prepared_job_still_imports_waits_for_its_park(
    node: Node, tmp_path: Path
) -> None:
    await node.send(prepare_command(tmp_path, "w", prepared_job(import_s=1.0)))
    await node.send(start_command(tmp_path, "w", prepared_job(), (0,)))
    (resumed,) = await node.wait_for(JobResumed)
    assert isinstance(resumed, JobResumed) and resumed.in_place and resumed.gpu_indices == (0,)
    assert await node.events(JobStarted) == []
    await eventually(lambda: _now(bool(visible_devices(tmp_path, "w")[0])))
    assert visible_devices(tmp_path, "w") == ["visible before='' after='0'"]


async def test_a_prepared_job_let_go_exits_at_once_and_a_cancel_kills_it(
    node: Node, tmp_path: Path
) -> None:
    await node.send(prepare_command(tmp_path, "w", prepared_job()))
    await node.wait_for(JobSuspended)
    # Started elsewhere: the scheduler tells this node to let go. Nothing to checkpoint.
    release = SuspendCommand(
        node_id=NODE, user="alice", job_id="w", attempt=1, reason=SuspendReason.MIGRATION
    )
    await node.send(release)
    left = (await node.wait_for(JobSuspended, count=2))[-1]
    assert isinstance(left, JobSuspended)
    assert not left.in_place and not left.forced and left.checkpoint_step is None
    (run,) = node.executor.runs()
    assert not run.alive
    assert await node.events(JobExited) == [] and await node.events(JobCheckpointed) == []
    assert not list((tmp_path / "checkpoints" / "alice" / "w").iterdir())

    await node.send(prepare_command(tmp_path, "c", prepared_job()))
    await node.wait_for(JobSuspended, job_id="c")
    await node.send(
        KillCommand(node_id=NODE, user="alice", job_id="c", attempt=1, reason="cancelled")
    )
    await eventually(lambda: _now(_ended(node, "c")))
    await consistently(lambda: exactly(node.events(JobExited), 0), QUIET_S)


async def test_a_prepared_job_that_never_parks_is_killed_and_starts_normally_later(
    memory_bus: InMemoryBus, tmp_path: Path, gpus: SimulatedGpus
) -> None:
    settings = make_settings(tmp_path, prepare_timeout_s=0.5)
    async for node in running_node(memory_bus, settings, gpus):
        # It does not use the SDK as it promised: it never parks.
        await node.send(prepare_command(tmp_path, "s", SLEEPER))
        await eventually(lambda n=node: _now(_ended(n, "s")), timeout_s=20.0)  # type: ignore[misc]
        await consistently(
            lambda n=node: exactly(n.events(JobSuspended, JobExited), 0),  # type: ignore[misc]
            QUIET_S,
        )
        await node.send(start_command(tmp_path, "s", SYNTHETIC, (0,)))
        (started,) = await node.wait_for(JobStarted)
        assert isinstance(started, JobStarted) and started.gpu_indices == (0,)


async def test_a_start_waits_for_a_prepared_job_no_longer_than_a_resume_may_take(
    memory_bus: InMemoryBus, tmp_path: Path, gpus: SimulatedGpus
) -> None:
    # The node's commands queue behind a start: a tenant whose prepared job never parks must
    # not hold them up for the whole prepare timeout.
    settings = make_settings(tmp_path, prepare_timeout_s=600.0, resume_timeout_s=0.5)
    async for node in running_node(memory_bus, settings, gpus):
        await node.send(prepare_command(tmp_path, "s", SLEEPER))
        await node.send(start_command(tmp_path, "s", SYNTHETIC, (0,)))
        (started,) = await node.wait_for(JobStarted, timeout_s=10.0)
        assert isinstance(started, JobStarted) and started.gpu_indices == (0,)
        assert await node.events(JobResumed) == []
        (run,) = node.executor.running()
        assert run.job.job_id == "s" and run.gpu_indices == (0,)


async def test_stops_past_the_command_age_are_forgotten_and_recent_ones_still_count(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A node remembers the newest stop of each job to recognise a redelivered start; over its
    # lifetime that would pile up, so stops older than any start it still takes are let go.
    from gfair_services.node_executor import job_commands

    monkeypatch.setattr(job_commands, "_STOPS_KEPT", 3)
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    for index in range(4):
        stop = SuspendCommand(node_id=NODE, user="alice", job_id=f"old{index}", attempt=1)
        await node.send(stop, time_=long_ago)
    recent = start_command(tmp_path, "recent", SLEEPER, (0,))
    sent = datetime.now(UTC)
    await node.send(SuspendCommand(node_id=NODE, user="alice", job_id="recent", attempt=1))
    await eventually(lambda: {ref.job_id for ref in node.executor._commands._stopped} == {"recent"})
    # A start sent before that suspend is still a redelivery.
    await node.executor.on_command(
        Envelope.wrap(recent, source="split-stride", time=sent - timedelta(seconds=1)), recent
    )
    await consistently(lambda: exactly(node.events(JobStarted), 0), QUIET_S)


async def test_an_engine_that_does_not_answer_is_reported_as_the_nodes_fault(
    memory_bus: InMemoryBus, tmp_path: Path, gpus: SimulatedGpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("aiodocker", reason="the containers extra: pip install 'gfair[containers]'")
    from gfair.node.container_jobs import CONTAINER_ENGINE_DOWN

    # Container jobs allowed, the engine's socket where nothing listens.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    settings = make_settings(tmp_path, job_images=("gfair-test/",))
    async for node in running_node(memory_bus, settings, gpus):
        (heartbeat,) = [e.data for e in await node.executor.heartbeat()]
        assert isinstance(heartbeat, NodeHeartbeat)
        assert heartbeat.fault is not None and CONTAINER_ENGINE_DOWN in heartbeat.fault
