"""Virtual nodes: an executor whose jobs are virtual reports them as one whose jobs are processes.

The same scenario runs on a real executor (synthetic job processes) and on a virtual one; the
services must not be able to tell which node they talk to.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gfair.bus.history import read_history
from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.transport import BusError, PubAck, PublishFailed
from gfair.events.commands import KillCommand, SuspendCommand
from gfair.events.envelope import EventData
from gfair.events.jobs import (
    JobCheckpointed,
    JobExited,
    JobProgress,
    JobResumed,
    JobStarted,
    JobSuspended,
)
from gfair.events.nodes import NodeRegistered
from gfair.events.reasons import SuspendReason
from gfair.events.subjects import NODES_STREAM
from gfair.node.simulated import SimulatedGpus
from gfair.node.virtual_jobs import VirtualHost
from gfair.sdk.throughput_table import ThroughputTable
from gfair_services.node_executor import CANNOT_START_EXIT_CODE, NodeExecutor
from gfair_services.node_executor.report_relay import PROGRESS_LATE_S
from gfair_services.node_executor.settings import NodeExecutorSettings
from gfair_services.node_executor.virtual_nodes import (
    part_environment,
    part_servers,
    run_parts,
    virtual_executors,
    virtual_parts,
)
from node.helpers import reachable_tmp, sdk_on_pythonpath
from support.waiting import consistently, eventually

from .test_node_executor import (
    FAST,
    JOB_EVENTS,
    NODE,
    QUIET_S,
    SYNTHETIC,
    Node,
    exactly,
    make_settings,
    memory_bus,
    start_command,
)

tmp_path = pytest.fixture(name="tmp_path")(reachable_tmp)
sdk_for_jobs = pytest.fixture(autouse=True)(sdk_on_pythonpath)
__all__ = ["memory_bus"]  # a fixture the tests here use


async def started_node(
    bus: InMemoryBus, tmp_path: Path, *, virtual: bool, **settings: object
) -> AsyncIterator[Node]:
    gpus = SimulatedGpus("v100:2,k80:1", node_id=NODE)
    host = VirtualHost() if virtual else None
    executor = NodeExecutor(make_settings(tmp_path, **settings), gpus=gpus, host=host)
    runtime = ServiceRuntime(executor.service, bus, settings=FAST)
    await runtime.start()
    try:
        yield Node(bus, executor, gpus)
    finally:
        await runtime.stop()
        await executor.close()


async def sliced_run(node: Node, tmp_path: Path) -> list[EventData]:
    """Start, progress, a time slice's suspend, a resume here, and the job's completion."""
    # 20 steps/s, 60 steps: 3 s of training with a checkpoint every 10 steps.
    argv = (*SYNTHETIC, "--iterations", "60", "--steps-per-s", "20", "--checkpoint-every", "10")
    await node.send(start_command(tmp_path, "resnet", argv, (0, 1)))
    await node.wait_for(JobProgress, count=2)
    await node.send(SuspendCommand(node_id=NODE, user="alice", job_id="resnet", attempt=1))
    await node.wait_for(JobSuspended)
    await node.send(start_command(tmp_path, "resnet", argv, (0, 1)))
    await node.wait_for(JobResumed)
    await node.wait_for(JobExited, timeout_s=30.0)
    history = await node.events(*JOB_EVENTS, JobExited, job_id="resnet")
    # Its exit is its last event.
    await consistently(
        lambda: exactly(node.events(*JOB_EVENTS, JobExited, job_id="resnet"), len(history)),
        QUIET_S,
    )
    return history


def lifecycle(history: list[EventData]) -> list[str]:
    """The event kinds but progress (which comes by the clock), repeats counted once."""
    kinds: list[str] = []
    for event in history:
        kind = type(event).__name__
        if kind != "JobProgress" and (not kinds or kinds[-1] != kind):
            kinds.append(kind)
    return kinds


def check_sliced_run(history: list[EventData]) -> None:
    kinds = [type(e).__name__ for e in history]
    assert kinds[0] == "JobStarted" and kinds[-1] == "JobExited"
    assert kinds.count("JobStarted") == kinds.count("JobResumed") == 1
    suspend_at, resume_at = kinds.index("JobSuspended"), kinds.index("JobResumed")
    suspended, resumed, exited = history[suspend_at], history[resume_at], history[-1]
    assert isinstance(suspended, JobSuspended) and isinstance(resumed, JobResumed)
    assert isinstance(exited, JobExited) and exited.exit_code == 0 and exited.signal is None
    assert suspended.reason is SuspendReason.TIME_SLICE and not suspended.forced
    assert suspended.checkpoint_step is not None and 0 < suspended.checkpoint_step < 60
    # The yield's checkpoint comes before the suspension; the run resumes from it.
    before = history[suspend_at - 1]
    assert isinstance(before, JobCheckpointed) and before.step == suspended.checkpoint_step
    assert resume_at == suspend_at + 1
    assert "JobProgress" in kinds[1:suspend_at]
    assert resumed.checkpoint_step == suspended.checkpoint_step
    progress = [e for e in history if isinstance(e, JobProgress)]
    assert progress and all(p.generation == "v100" for p in progress)
    assert all(p.minibatches_per_s == pytest.approx(20.0, rel=0.25) for p in progress)
    after = [e for e in history[resume_at:] if isinstance(e, JobProgress)]
    assert after and min(p.iterations for p in after) >= suspended.checkpoint_step
    checkpoints = [e.step for e in history if isinstance(e, JobCheckpointed)]
    assert checkpoints == sorted(checkpoints) and checkpoints[-1] == 60
    # Every tenth step is checkpointed on the way (the yield's may fall between them).
    assert {10, 20, 30, 40, 50} <= set(checkpoints)


async def test_a_virtual_node_reports_a_sliced_job_as_a_real_one_does(tmp_path: Path) -> None:
    histories = {}
    for virtual in (False, True):
        where = tmp_path / ("virtual" if virtual else "real")
        bus = InMemoryBus()
        try:
            async for node in started_node(bus, where, virtual=virtual, suspend_timeout_s=10.0):
                histories[virtual] = await sliced_run(node, where)
        finally:
            await bus.close()
        # A virtual job runs no process: nothing of it is left on the node's disk.
        assert (where / "work" / "runs" / "alice" / "resnet").exists() is not virtual
    for history in histories.values():
        check_sliced_run(history)
    assert lifecycle(histories[True]) == lifecycle(histories[False])


async def test_a_virtual_job_trains_at_its_job_types_speed_on_each_generation(
    memory_bus: InMemoryBus, tmp_path: Path
) -> None:
    table = ThroughputTable.load()
    job_type = "ResNet-50 (batch size 32)"
    async for node in started_node(memory_bus, tmp_path, virtual=True, progress_interval_s=0.1):
        for job_id, gpus in (("on-v100", (0, 1)), ("on-k80", (2,))):
            argv = (*SYNTHETIC, "--duration-s", "600", "--speed-scale", "10")
            await node.send(start_command(tmp_path, job_id, argv, gpus))
        for job_id, generation, count in (("on-v100", "v100", 2), ("on-k80", "k80", 1)):
            (progress, *_) = await node.wait_for(JobProgress, job_id=job_id)
            assert isinstance(progress, JobProgress) and progress.generation == generation
            expected = 10 * table.steps_per_s(job_type, generation, count)
            assert progress.minibatches_per_s == pytest.approx(expected)


async def test_virtual_failures_hangs_and_kills_are_reported_as_real_ones(
    memory_bus: InMemoryBus, tmp_path: Path
) -> None:
    async for node in started_node(memory_bus, tmp_path, virtual=True, suspend_timeout_s=0.3):
        fast = (*SYNTHETIC, "--iterations", "1000", "--steps-per-s", "50")
        await node.send(start_command(tmp_path, "crash", (*fast, "--fail-at-step", "5",
                                                          "--exit-code", "3"), (0,)))  # fmt: skip
        await node.send(start_command(tmp_path, "hung", (*fast, "--hang-at-step", "2"), (1,)))
        await node.send(start_command(tmp_path, "not-synthetic", ("/bin/true",), (2,)))
        exits = await node.wait_for(JobExited, count=2)
        by_job = {e.job_id: e for e in exits if isinstance(e, JobExited)}
        assert (by_job["crash"].exit_code, by_job["crash"].signal) == (3, None)
        assert "injected failure at step 5" in by_job["crash"].stderr_tail
        assert by_job["not-synthetic"].exit_code == CANNOT_START_EXIT_CODE
        # A hung job ignores its yield: past the grace it is killed, and keeps no new checkpoint.
        await node.send(
            SuspendCommand(node_id=NODE, user="alice", job_id="hung", attempt=1, yield_grace_s=0.2)
        )
        (suspended,) = await node.wait_for(JobSuspended)
        assert isinstance(suspended, JobSuspended)
        assert suspended.forced and suspended.checkpoint_step is None
        # A kill is not reported: whoever asked for it decided what follows.
        await node.send(start_command(tmp_path, "victim", fast, (1,)))
        await node.wait_for(JobStarted, job_id="victim")
        await node.send(
            KillCommand(node_id=NODE, user="alice", job_id="victim", attempt=1, reason="test")
        )
        await eventually(lambda n=node: n.executor.running() == [])  # type: ignore[misc]
        await consistently(
            lambda n=node: exactly(n.events(JobExited, job_id="victim"), 0),  # type: ignore[misc]
            QUIET_S,
        )


async def test_virtual_nodes_of_one_process_each_serve_their_own_commands_and_share_checkpoints(
    memory_bus: InMemoryBus, tmp_path: Path
) -> None:
    settings = make_settings(tmp_path, virtual_nodes="v100:2x2")
    executors = virtual_executors(settings)
    assert [e.node_id for e in executors] == ["v100-0", "v100-1"]
    runtimes = [ServiceRuntime(e.service, memory_bus, settings=FAST) for e in executors]
    for runtime in runtimes:
        await runtime.start()
    node = Node(memory_bus, executors[0], SimulatedGpus("v100:2"))
    try:
        registered = await node.wait_for(NodeRegistered, count=2)
        assert sorted(getattr(r, "node_id", "") for r in registered) == ["v100-0", "v100-1"]
        argv = (*SYNTHETIC, "--iterations", "100000", "--steps-per-s", "50")
        first = start_command(tmp_path, "mover", argv, (0, 1))
        await node.send(first.model_copy(update={"node_id": "v100-0"}))
        await node.wait_for(JobProgress)
        await node.send(
            SuspendCommand(
                node_id="v100-0",
                user="alice",
                job_id="mover",
                attempt=1,
                reason=SuspendReason.MIGRATION,
            )
        )
        (suspended,) = await node.wait_for(JobSuspended)
        assert isinstance(suspended, JobSuspended) and suspended.node_id == "v100-0"
        assert suspended.checkpoint_step is not None and suspended.checkpoint_step > 0
        # Started on the other node, it resumes from the checkpoint the first one took.
        await node.send(first.model_copy(update={"node_id": "v100-1", "gpu_indices": (1,)}))
        (resumed,) = await node.wait_for(JobResumed)
        assert isinstance(resumed, JobResumed)
        assert (resumed.node_id, resumed.checkpoint_step) == ("v100-1", suspended.checkpoint_step)
        assert [r.job.job_id for r in executors[1].running()] == ["mover"]
        assert executors[0].running() == []
    finally:
        for runtime in runtimes:
            await runtime.stop()
        for executor in executors:
            await executor.close()


def test_a_bad_virtual_cluster_spec_stops_the_executor_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="server count must be >= 1"):
        make_settings(tmp_path, virtual_nodes="v100:0x8")


class _SlowBroker(InMemoryBus):
    """A broker under load: every publish takes `delay_s` to be acknowledged."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    async def publish(self, subject: str, payload: bytes, **options: Any) -> PubAck:
        await asyncio.sleep(self.delay_s)
        return await super().publish(subject, payload, **options)


async def test_a_busy_node_lets_progress_reports_go_rather_than_hold_up_a_suspend(
    tmp_path: Path,
) -> None:
    # Three users' jobs reporting every 20 ms to a broker that takes 50 ms a publish: more
    # reports than the node can publish, as at a hundred servers with eight jobs each.
    bus = _SlowBroker(0.05)
    argv = (*SYNTHETIC, "--iterations", "100000", "--steps-per-s", "200")
    users = ("alice", "bob", "carol")
    try:
        async for node in started_node(bus, tmp_path, virtual=True, progress_interval_s=0.02):
            for gpu, user in enumerate(users):
                await node.send(start_command(tmp_path, user, argv, (gpu,), user=user))
            await node.wait_for(JobProgress, count=len(users) * 2)
            await asyncio.sleep(2.0)  # the reports come faster than they go out
            before = len(await node.envelopes(*JOB_EVENTS))
            await node.send(SuspendCommand(node_id=NODE, user="alice", job_id="alice", attempt=1))
            await node.wait_for(JobSuspended)
            history = await node.envelopes(*JOB_EVENTS)
    finally:
        await bus.close()
    kinds = [envelope.type for envelope in history]
    suspended = kinds.index(JobSuspended.EVENT_TYPE)
    # Ahead of the suspend's events went at most what a second of publishing takes (the age
    # past which a report is let go: 20 publishes), not the backlog (hundreds, and growing).
    ahead = kinds[before:suspended].count(JobProgress.EVENT_TYPE)
    assert ahead <= PROGRESS_LATE_S / bus.delay_s + len(users), ahead
    # Every job was heard of all the same.
    reporting = {e.data["job_id"] for e in history if e.type == JobProgress.EVENT_TYPE}
    assert reporting == set(users)


class _UnacknowledgingBroker(InMemoryBus):
    """A broker too busy to acknowledge the first `refusals` publishes on `subject_part`."""

    def __init__(self, subject_part: str, refusals: int) -> None:
        super().__init__()
        self.subject_part, self.refusals = subject_part, refusals

    async def publish(self, subject: str, payload: bytes, **options: Any) -> PubAck:
        if self.subject_part in subject and self.refusals > 0:
            self.refusals -= 1
            raise PublishFailed(f"publish to {subject!r} not acknowledged")
        return await super().publish(subject, payload, **options)


async def test_a_report_the_broker_does_not_acknowledge_is_published_again_not_lost(
    tmp_path: Path,
) -> None:
    bus = _UnacknowledgingBroker(".exited.", refusals=2)
    argv = (*SYNTHETIC, "--iterations", "3")
    try:
        async for node in started_node(bus, tmp_path, virtual=True):
            await node.send(start_command(tmp_path, "alice", argv, (0,)))
            (exited,) = await node.wait_for(JobExited, timeout_s=30.0)
            kinds = [e.type for e in await node.envelopes(*JOB_EVENTS, JobExited)]
    finally:
        await bus.close()
    assert bus.refusals == 0  # it was refused twice, then stored once
    assert isinstance(exited, JobExited) and exited.exit_code == 0
    assert kinds.count(JobExited.EVENT_TYPE) == 1


def test_a_spec_runs_in_parts_of_servers_per_process_each_process_its_own() -> None:
    parts = virtual_parts("v100:3x2,k80:2x2", 2)
    assert [[s.id for s in part] for part in parts] == [
        ["v100-0", "v100-1"],
        ["v100-2", "k80-0"],
        ["k80-1"],
    ]
    settings = NodeExecutorSettings(
        virtual_nodes="v100:3x2,k80:2x2", virtual_nodes_per_process=2, virtual_part=1
    )
    assert [s.id for s in part_servers(settings)] == ["v100-2", "k80-0"]
    # Without a part, a process is given every server (it runs them in parts of its own).
    whole = settings.model_copy(update={"virtual_part": None})
    assert len(part_servers(whole)) == 5
    with pytest.raises(ValidationError, match="make 3 parts"):
        NodeExecutorSettings(
            virtual_nodes="v100:3x2,k80:2x2", virtual_nodes_per_process=2, virtual_part=3
        )
    with pytest.raises(ValidationError, match="give virtual_nodes"):
        NodeExecutorSettings(virtual_part=0)


def test_a_part_gets_the_settings_given_to_the_process_that_starts_it(tmp_path: Path) -> None:
    # Given as flags of `gfair service node-executor`, they are in no environment variable.
    settings = NodeExecutorSettings(
        virtual_nodes="v100:5x2",
        virtual_nodes_per_process=2,
        heartbeat_s=7.0,
        work_base=tmp_path,
    )
    env = part_environment(settings, 2)
    assert env["GFAIR_VIRTUAL_PART"] == "2"
    assert env["GFAIR_VIRTUAL_NODES_PER_PROCESS"] == "2"
    assert env["GFAIR_HEARTBEAT_S"] == "7.0"
    assert env["GFAIR_WORK_BASE"] == str(tmp_path)
    # Each virtual node's own settings are made per node, not handed on.
    assert env.get("GFAIR_WORK_ROOT") == os.environ.get("GFAIR_WORK_ROOT")


def test_progress_is_reported_a_few_times_a_slice_unless_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # At 60 s quanta every 10 s, at gfair up's 3 s every second, within 1 to 10 s.
    every = {q: NodeExecutorSettings(quantum_s=q).progress_every_s for q in (3, 12, 60, 600)}
    assert every == {3: 1.0, 12: 2.0, 60: 10.0, 600: 10.0}
    monkeypatch.setenv("GFAIR_QUANTUM_S", "30")  # what gfair up and compose give every child
    assert NodeExecutorSettings().progress_every_s == 5.0
    monkeypatch.setenv("GFAIR_PROGRESS_INTERVAL_S", "0.5")
    assert NodeExecutorSettings().progress_every_s == 0.5


def test_a_checkpoint_taken_by_one_process_virtual_node_is_found_by_another_process(
    tmp_path: Path,
) -> None:
    # Virtual nodes run in several processes: a job suspended on a node of one resumes on a
    # node of another, from the step it reached, as a real job from the shared checkpoint root.
    here, there = VirtualHost(), VirtualHost()
    checkpoints = tmp_path / "checkpoints" / "alice" / "resnet"
    assert there.latest_checkpoint(checkpoints) is None
    here.commit(checkpoints, 40)
    found = there.latest_checkpoint(checkpoints)
    assert found is not None and (found.seq, found.step) == (1, 40)
    there.commit(checkpoints, 55)
    latest = here.latest_checkpoint(checkpoints)
    assert latest is not None and (latest.seq, latest.step) == (2, 55)
    assert latest.path == checkpoints / "ckpt-000000000002"


@pytest.mark.nats
async def test_a_process_given_more_servers_than_it_runs_starts_its_parts_and_stops_them(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A deployment's load test: one process given the whole spec runs it in parts, a process
    # and a NATS connection each, every server registered; on stop, the parts end.
    monkeypatch.setenv("GFAIR_NATS_URL", nats_url)
    monkeypatch.setenv("GFAIR_LOG_LEVEL", "WARNING")
    settings = make_settings(
        tmp_path, virtual_nodes="v100:3x1", virtual_nodes_per_process=2, heartbeat_s=0.5
    )
    stop = asyncio.Event()
    running = asyncio.create_task(run_parts(settings, 2, stop))
    bus = await NatsBus.connect(NatsOptions(servers=(nats_url,)))
    try:
        registered: set[str] = set()
        clients: set[str] = set()
        deadline = asyncio.get_running_loop().time() + 60.0
        while len(registered) < 3 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.5)
            with contextlib.suppress(BusError):
                registered = {
                    past.data.node_id
                    async for past in read_history(
                        bus, NODES_STREAM.name, accepts=(NodeRegistered,)
                    )
                    if isinstance(past.data, NodeRegistered)
                }
        assert registered == {"v100-0", "v100-1", "v100-2"}
        reply = await bus.client.request("$SYS.REQ.SERVER.PING.CONNZ", b"{}", timeout=2.0)
        clients = {c.get("name", "") for c in json.loads(reply.data)["data"]["connections"]}
        assert {"node-executor-virtual-0", "node-executor-virtual-1"} <= clients
    finally:
        stop.set()
        await asyncio.wait_for(running, 90.0)
        await bus.close()
