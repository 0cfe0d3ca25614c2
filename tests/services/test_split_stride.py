"""The split-stride service on the in-memory bus: the decision kernel's quanta carried out, GPU
assignment, moves, residency, restarts.

The service's own timer is set far beyond the test, and ticks are driven by calling `on_tick`,
so every quantum boundary is where the test puts it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gfair.bus import publisher
from gfair.bus.dead_letter import DeadLetter, DeadLetterReason
from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.transport import PubAck, PublishFailed
from gfair.core.scheduler import Exited, Launch, Phase, Recording, Releases, SchedulerJob
from gfair.events.commands import KillCommand, PrepareCommand, StartCommand, SuspendCommand
from gfair.events.envelope import Envelope, EventData
from gfair.events.job_array import ArrayMembership, array_environment
from gfair.events.jobs import (
    JobAccepted,
    JobCancelled,
    JobCompleted,
    JobExited,
    JobPlaced,
    JobRetried,
    JobStarted,
    JobSuspended,
)
from gfair.events.nodes import NodeFailed, NodeQuarantined
from gfair.events.reasons import FailureClass, SuspendReason
from gfair.events.scheduling import QuantumTicked, ScheduleDecided
from gfair.events.states import JobState, NodeState
from gfair.state.buckets import JOBS, STRIDE
from gfair.state.job_record import JobRecord, save_job
from gfair.state.stride_record import STATE_KEY, StrideRecord, load_stride, save_stride
from gfair_services.placement.service import admission
from gfair_services.split_stride import SplitStrideService, SplitStrideSettings
from gfair_services.split_stride import record as stride_record
from gfair_services.split_stride import service as split_stride_service
from gfair_services.topology import cluster_topology
from support.waiting import consistently, eventually

from .scheduling_harness import FAST, Probe, registered, submitted

# Every machine these tests make checks its index after every input.
pytestmark = pytest.mark.usefixtures("checked_machines")

COMMANDS = "GFAIR_COMMANDS"
SCHED = "GFAIR_SCHED"
NEVER = 3600.0  # the service's own timer: ticks come from the tests


@pytest.fixture
def bus() -> InMemoryBus:
    return InMemoryBus()


@pytest.fixture
def probe(bus: InMemoryBus) -> Probe:
    return Probe(bus)


@pytest.fixture
def settings(tmp_path: Path) -> SplitStrideSettings:
    return SplitStrideSettings(quantum_s=NEVER, checkpoint_root=tmp_path / "ck")


@asynccontextmanager
async def split_stride(
    bus: InMemoryBus, settings: SplitStrideSettings
) -> AsyncIterator[SplitStrideService]:
    state = SplitStrideService(settings)
    async with ServiceRuntime(state.service(), bus, settings=FAST):
        yield state


async def register(probe: Probe, state: SplitStrideService, *nodes: tuple[str, int]) -> None:
    for node_id, gpus in nodes:
        await probe.publish(registered(node_id, node_id.split("-")[0], gpus))
    await eventually(lambda: all(n in state.inventory for n, _ in nodes))


async def admit(
    probe: Probe,
    state: SplitStrideService,
    user: str,
    job_id: str,
    gpus: int = 1,
    **fields: object,
) -> JobAccepted:
    """What placement does: announce the admission, with what the job's starts need. Its
    record is not written: split-stride reads nothing of placement's."""
    data = submitted(user, job_id, gpus, **fields)
    emit = admission(JobRecord.accepted(Envelope.wrap(data, source="test"), data))
    assert isinstance(emit.data, JobAccepted)
    await probe.publish(emit.data, correlation_id=emit.correlation_id)
    await eventually(lambda: f"{user}.{job_id}" in state.machine.jobs)
    return emit.data


def placements(probe: Probe) -> list[JobPlaced]:
    return probe.payloads("GFAIR_JOBS", JobPlaced)


def starts(probe: Probe) -> list[StartCommand]:
    return probe.payloads(COMMANDS, StartCommand)


def suspends(probe: Probe) -> list[SuspendCommand]:
    return probe.payloads(COMMANDS, SuspendCommand)


def tick_until_suspended(state: SplitStrideService, probe: Probe) -> Callable[[], Awaitable[bool]]:
    """A check for `eventually`: tick, then whether a suspend went out (a turn came)."""

    async def suspended() -> bool:
        await state.on_tick()
        await probe.drained()
        return bool(suspends(probe))

    return suspended


def decisions(probe: Probe, quantum: int) -> dict[str, ScheduleDecided]:
    """The tick's decision for `quantum`, per server (what followed its QuantumTicked)."""
    found: dict[str, ScheduleDecided] = {}
    inside = False
    for data in probe.payloads(SCHED, EventData):
        if isinstance(data, QuantumTicked):
            inside = data.quantum == quantum
        elif isinstance(data, ScheduleDecided) and inside and data.quantum == quantum:
            found[data.server] = data
    return found


async def started(probe: Probe, command: StartCommand) -> None:
    """The node executor's report for `command`."""
    await probe.publish(
        JobStarted(
            user=command.user,
            job_id=command.job_id,
            node_id=command.node_id,
            gpu_indices=command.gpu_indices,
            attempt=command.attempt,
        )
    )


async def yielded(probe: Probe, command: SuspendCommand) -> None:
    """The node executor's report that the job (attempt 1) yielded its slice."""
    await probe.publish(
        JobSuspended(
            user=command.user,
            job_id=command.job_id,
            node_id=command.node_id,
            attempt=1,
            reason=SuspendReason.TIME_SLICE,
        )
    )


def completed_on(node_id: str, job_id: str) -> JobExited:
    """The node executor's report that alice's `job_id` (attempt 1) ended with exit code 0."""
    return JobExited(
        user="alice", job_id=job_id, node_id=node_id, attempt=1, exit_code=0, runtime_s=1
    )


async def test_a_placed_job_starts_at_once_on_idle_gpus(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 4))
        await admit(probe, state, "alice", "j1", 2, env={"SEED": "1"}, working_dir="/work")
        (start,) = await probe.wait_for(COMMANDS, StartCommand)
    (placed,) = placements(probe)
    assert (placed.servers, placed.generation) == (("v100-0",), "v100")
    assert (start.node_id, start.gpu_indices, start.attempt) == ("v100-0", (0, 1), 1)
    assert start.command == ("python", "-c", "pass") and start.env == {"SEED": "1"}
    assert start.working_dir == "/work"
    assert start.checkpoint_dir == str(settings.checkpoint_root / "alice" / "j1")
    (decided,) = probe.payloads(SCHED, ScheduleDecided)
    assert [str(ref) for ref in decided.running] == ["alice/j1"]


async def test_jobs_time_slice_one_gpu_and_never_share_it(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1))
        await admit(probe, state, "alice", "a")
        await admit(probe, state, "bob", "b")
        (first,) = await probe.wait_for(COMMANDS, StartCommand)
        assert first.job_id == "a"  # b found no idle GPU
        runs = []
        for quantum in range(4):
            await state.on_tick()
            runs.append([str(r) for r in decisions(probe, quantum)["v100-0"].running])
    # One GPU, equal tickets: they alternate, one at a time.
    assert all(len(run) == 1 for run in runs)
    assert Counter(job for run in runs for job in run) == {"alice/a": 2, "bob/b": 2}
    commands = probe.events(COMMANDS, SuspendCommand) + probe.events(COMMANDS, StartCommand)
    commands.sort(key=lambda pair: pair[0].time)
    holder: str | None = None
    for _, command in commands:
        # Every start comes after the suspend of whoever held the GPU.
        if isinstance(command, StartCommand):
            assert holder is None, f"{command.job_id} started while {holder} held GPU 0"
            holder = command.job_id
        else:
            assert command.job_id == holder and command.reason is SuspendReason.TIME_SLICE
            holder = None


async def test_users_get_gpu_time_in_proportion_to_their_tickets(
    bus: InMemoryBus, probe: Probe, tmp_path: Path
) -> None:
    settings = SplitStrideSettings(
        quantum_s=NEVER, checkpoint_root=tmp_path, user_tickets="alice=2,bob=1,carol=1"
    )
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 2))
        for user in ("alice", "bob", "carol"):
            for n in range(2):
                await admit(probe, state, user, f"{user}{n}")
        for _ in range(40):
            await state.on_tick()
    quanta: Counter[str] = Counter()
    for quantum in range(40):
        for decided in decisions(probe, quantum).values():
            quanta.update(ref.user for ref in decided.running)
    total = sum(quanta.values())
    assert total == 40 * 2
    assert quanta["alice"] / total == pytest.approx(0.5, abs=0.04)
    assert quanta["bob"] / total == pytest.approx(0.25, abs=0.04)
    assert quanta["carol"] / total == pytest.approx(0.25, abs=0.04)


async def test_a_gang_starts_on_all_its_servers_in_one_quantum(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 4), ("v100-1", 4))
        await admit(probe, state, "alice", "local", 4)
        await admit(probe, state, "bob", "gang", 8)
        await probe.wait_for(COMMANDS, StartCommand)  # local took v100-0 at once
        for _ in range(4):
            await state.on_tick()
        gang_quanta = [
            q
            for q in range(4)
            if any(str(r) == "bob/gang" for r in decisions(probe, q)["v100-0"].running)
        ]
    assert gang_quanta, "the gang never ran"
    for quantum in gang_quanta:
        both = decisions(probe, quantum)
        assert both["v100-0"].central and both["v100-1"].central
        assert [str(r) for r in both["v100-1"].running] == ["bob/gang"]
    gang_starts = [s for s in starts(probe) if s.job_id == "gang"]
    assert {s.node_id: s.gpu_indices for s in gang_starts[:2]} == {
        "v100-0": (0, 1, 2, 3),
        "v100-1": (0, 1, 2, 3),
    }
    # Each part learns its rank and where the first part listens (its node's hostname).
    envs = {s.node_id: s.env for s in gang_starts[:2]}
    first = next(node for node, env in envs.items() if env["NODE_RANK"] == "0")
    assert {env["NODE_RANK"] for env in envs.values()} == {"0", "1"}
    for env in envs.values():
        assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == first
        assert env["NNODES"] == env["PET_NNODES"] == "2"
        assert env["PET_NPROC_PER_NODE"] == "4"
    assert len({env["MASTER_PORT"] for env in envs.values()}) == 1
    (local,) = [s for s in starts(probe) if s.job_id == "local"][:1]
    assert "MASTER_ADDR" not in local.env  # a job on one server needs none


async def test_a_moved_job_starts_on_its_new_server_only_after_the_old_one_let_go(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1), ("k80-0", 1))
        await admit(probe, state, "alice", "a")
        await admit(probe, state, "bob", "b")
        first, second = await probe.wait_for(COMMANDS, StartCommand, lambda f: len(f) == 2)
        assert (first.node_id, second.node_id) == ("v100-0", "k80-0")  # fastest idle GPU first
        await started(probe, second)
        await probe.publish(JobCancelled(user="alice", job_id="a", previous_state=JobState.RUNNING))
        await eventually(lambda: "alice.a" not in state.machine.jobs)
        # The V100 is idle and b runs faster there: the kernel moves it.
        await state.on_tick()
        (suspend,) = suspends(probe)
        assert (suspend.node_id, suspend.reason) == ("k80-0", SuspendReason.MIGRATION)
        assert placements(probe)[-1].servers == ("v100-0",)
        assert len(starts(probe)) == 2  # not yet on v100-0: k80-0 still holds it
        await state.on_tick()
        assert len(starts(probe)) == 2
        await probe.publish(
            JobSuspended(
                user="bob",
                job_id="b",
                node_id="k80-0",
                attempt=1,
                reason=SuspendReason.MIGRATION,
                checkpoint_step=12,
            )
        )
        await probe.wait_for(COMMANDS, StartCommand, lambda found: len(found) == 3)
    assert (starts(probe)[-1].job_id, starts(probe)[-1].node_id) == ("b", "v100-0")


async def stop_before_its_start_is_confirmed(probe: Probe, state: SplitStrideService) -> None:
    """Bob's job starts on k80-0, and the next quantum moves it to the V100 that alice's
    cancelled job left before k80-0 confirmed that start."""
    await register(probe, state, ("v100-0", 1), ("k80-0", 1))
    await admit(probe, state, "alice", "a")
    await admit(probe, state, "bob", "b")
    await probe.wait_for(COMMANDS, StartCommand, lambda f: len(f) == 2)
    await probe.publish(JobCancelled(user="alice", job_id="a", previous_state=JobState.RUNNING))
    await eventually(lambda: "alice.a" not in state.machine.jobs)
    await state.on_tick()  # b moves to the V100 before k80-0 confirmed its start


async def test_a_stop_of_an_unconfirmed_start_is_forgotten_soon_even_after_a_reload(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    # A node that refused the start answers neither it nor the stop: only the short
    # `unconfirmed_release_s` may hold the job back, also once the ledger was reloaded from
    # its record (as after a failed write).
    settings = settings.model_copy(update={"unconfirmed_release_s": 0.2})
    async with split_stride(bus, settings) as state:
        await stop_before_its_start_is_confirmed(probe, state)
        (suspend,) = suspends(probe)
        assert suspend.node_id == "k80-0"
    async with split_stride(bus, settings) as state:
        assert state.machine.jobs["bob.b"].stays["k80-0"].unconfirmed
        await asyncio.sleep(0.3)  # pause under test: the release time passes (the real clock)
        await state.on_tick()
        await probe.wait_for(COMMANDS, StartCommand, lambda found: len(found) == 3)
    assert (starts(probe)[-1].job_id, starts(probe)[-1].node_id) == ("b", "v100-0")


async def test_no_stop_is_forgotten_while_the_nodes_reports_wait_unread(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As above, but split-stride is behind on its job events (made so here: any backlog counts
    # as one): the node's answer may be among them, so the stop is not forgotten until they
    # are read; forgetting it while the node carries it out would put the job on two servers.
    settings = settings.model_copy(update={"unconfirmed_release_s": 0.2})
    async with split_stride(bus, settings) as state:
        await stop_before_its_start_is_confirmed(probe, state)
        monkeypatch.setattr(split_stride_service, "CAUGHT_UP_UNREAD", 0)
        await asyncio.sleep(0.3)  # pause under test: the release time passes (the real clock)
        await state.on_tick()
        await consistently(lambda: len(starts(probe)) == 2, 0.1)
        assert state.machine.jobs["bob.b"].stays["k80-0"].unconfirmed
        monkeypatch.undo()  # caught up: the node's silence is heard now
        await state.on_tick()
        await probe.wait_for(COMMANDS, StartCommand, lambda found: len(found) == 3)
    assert (starts(probe)[-1].job_id, starts(probe)[-1].node_id) == ("b", "v100-0")


async def test_a_job_still_suspending_is_not_backfilled_onto_another_server(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1), ("v100-1", 1))
        await admit(probe, state, "alice", "a")
        await admit(probe, state, "bob", "b")
        for start in await probe.wait_for(COMMANDS, StartCommand, lambda f: len(f) == 2):
            await started(probe, start)
        await admit(probe, state, "carol", "c")
        for _ in range(3):  # three users, two GPUs: one of a and b makes way for c
            await state.on_tick()
            if suspends(probe):
                break
        (suspend,) = suspends(probe)
        (other,) = [s for s in starts(probe)[:2] if s.job_id != suspend.job_id]
        # The other job ends while the suspended one is still checkpointing: its GPU is idle
        # and the suspended job waits, but it may not run there until its own node let go.
        await probe.publish(
            JobExited(
                user=other.user,
                job_id=other.job_id,
                node_id=other.node_id,
                attempt=1,
                exit_code=0,
                runtime_s=1,
            )
        )
        await probe.publish(JobCompleted(user=other.user, job_id=other.job_id, attempt=1))
        await eventually(lambda: f"{other.user}.{other.job_id}" not in state.machine.jobs)
        assert [s.job_id for s in starts(probe)] == ["a", "b", "c"]
        await yielded(probe, suspend)
        await probe.wait_for(COMMANDS, StartCommand, lambda found: len(found) == 4)
    resumed = starts(probe)[-1]
    assert (resumed.job_id, resumed.node_id) == (suspend.job_id, other.node_id)


async def test_an_exited_job_waits_for_its_verdict_and_a_retry_starts_the_next_attempt(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1))
        await admit(probe, state, "alice", "j1")
        (first,) = await probe.wait_for(COMMANDS, StartCommand)
        await started(probe, first)
        await probe.publish(
            JobExited(
                user="alice", job_id="j1", node_id="v100-0", attempt=1, exit_code=1, runtime_s=3
            )
        )
        await eventually(lambda: state.machine.jobs["alice.j1"].exited)
        await state.on_tick()
        assert len(starts(probe)) == 1  # no verdict yet: it does not run
        await probe.publish(
            JobRetried(
                user="alice",
                job_id="j1",
                attempt=2,
                delay_s=0,
                failure_class=FailureClass.INFRASTRUCTURE,
                reason="GPU fell off the bus",
            )
        )
        second = (await probe.wait_for(COMMANDS, StartCommand, lambda f: len(f) == 2))[-1]
    assert second.attempt == 2 and second.gpu_indices == (0,)


async def test_a_retry_waits_out_its_delay(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1))
        await admit(probe, state, "alice", "j1")
        await probe.wait_for(COMMANDS, StartCommand)
        await probe.publish(
            JobExited(
                user="alice", job_id="j1", node_id="v100-0", attempt=1, exit_code=1, runtime_s=1
            )
        )
        await probe.publish(
            JobRetried(
                user="alice",
                job_id="j1",
                attempt=2,
                delay_s=0.3,
                failure_class=FailureClass.USER_ERROR,
                reason="exit 1",
            )
        )
        await eventually(lambda: state.machine.jobs["alice.j1"].attempt == 2)
        await state.on_tick()
        assert len(starts(probe)) == 1

        async def started_again() -> bool:
            await state.on_tick()
            return len(starts(probe)) == 2

        await eventually(started_again, interval_s=0.05, what="the retry started after its delay")
    assert [s.attempt for s in starts(probe)] == [1, 2]


async def test_an_ended_job_is_killed_where_it_runs_and_frees_its_gpus(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1))
        await admit(probe, state, "alice", "j1")
        await admit(probe, state, "bob", "j2")
        await probe.wait_for(COMMANDS, StartCommand)
        await probe.publish(
            JobCancelled(user="alice", job_id="j1", previous_state=JobState.RUNNING)
        )
        (kill,) = await probe.wait_for(COMMANDS, KillCommand)
        assert (kill.node_id, kill.job_id) == ("v100-0", "j1")
        await state.on_tick()
    assert [s.job_id for s in starts(probe)] == ["j1", "j2"]
    assert suspends(probe) == []  # the GPU was free: nothing to take it from


async def start_then_lose_its_node(
    probe: Probe, state: SplitStrideService
) -> tuple[StartCommand, StartCommand]:
    """alice/j1 starts on one of two servers, that node is declared failed, and the next
    quantum starts the job on the other: the two start commands."""
    await register(probe, state, ("v100-0", 2), ("v100-1", 2))
    await admit(probe, state, "alice", "j1")
    (first,) = await probe.wait_for(COMMANDS, StartCommand)
    await started(probe, first)
    await probe.publish(NodeFailed(node_id=first.node_id, reason="no heartbeats"))
    await eventually(lambda: not state.machine.jobs["alice.j1"].stays)
    await state.on_tick()
    second = (await probe.wait_for(COMMANDS, StartCommand, lambda found: len(found) == 2))[-1]
    return first, second


async def test_jobs_on_a_failed_node_are_placed_elsewhere(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        first, second = await start_then_lose_its_node(probe, state)
    assert second.node_id != first.node_id
    assert first.node_id not in decisions(probe, 0)
    assert placements(probe)[-1].servers == (second.node_id,)
    assert suspends(probe) == []  # a dead node gets no suspend


async def test_the_end_of_a_copy_on_a_node_the_job_left_decides_nothing(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    # The node was declared failed while its copy kept running; the job started elsewhere. The
    # failure detector ignores that copy's end, so split-stride must not wait for its verdict.
    async with split_stride(bus, settings) as state:
        first, second = await start_then_lose_its_node(probe, state)
        await started(probe, second)
        await probe.publish(completed_on(first.node_id, "j1"))
        await probe.drained()
        job = state.machine.jobs["alice.j1"]
        assert not job.exited
        assert set(job.stays) == {second.node_id}
        # Its own node's exit still waits for the verdict.
        await probe.publish(completed_on(second.node_id, "j1"))
        await eventually(lambda: state.machine.jobs["alice.j1"].exited)


async def test_a_quarantined_node_is_drained(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 2))
        await admit(probe, state, "alice", "j1")
        (first,) = await probe.wait_for(COMMANDS, StartCommand)
        await started(probe, first)
        await probe.publish(
            NodeQuarantined(node_id="v100-0", reason="XID 79 three times", recent_failures=3)
        )
        await eventually(lambda: not state.inventory.nodes["v100-0"].schedulable)
        await state.on_tick()
        (suspend,) = await probe.wait_for(COMMANDS, SuspendCommand)
        await state.on_tick()
    assert (suspend.node_id, suspend.reason) == ("v100-0", SuspendReason.DRAIN)
    assert len(suspends(probe)) == 1


async def test_an_old_suspend_confirmed_after_a_new_start_keeps_the_job_running(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1))
        await admit(probe, state, "alice", "a")
        await admit(probe, state, "bob", "b")
        await probe.wait_for(COMMANDS, StartCommand)
        await state.on_tick()  # equal passes: a, which joined first, keeps the GPU
        await state.on_tick()  # a suspended, b started
        await state.on_tick()  # b suspended, a started again: a's first suspend unconfirmed
        a = state.machine.jobs["alice.a"].stays["v100-0"]
        assert (a.phase, a.pending_suspends) == (Phase.STARTING, 1)
        await probe.publish(
            JobSuspended(
                user="alice",
                job_id="a",
                node_id="v100-0",
                attempt=1,
                reason=SuspendReason.TIME_SLICE,
            )
        )
        await eventually(
            lambda: state.machine.jobs["alice.a"].stays["v100-0"].pending_suspends == 0
        )
        assert state.machine.jobs["alice.a"].stays["v100-0"].phase is Phase.STARTING


async def test_a_restarted_split_stride_continues_where_it_stopped(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1))
        await admit(probe, state, "alice", "a")
        await admit(probe, state, "bob", "b")
        await probe.wait_for(COMMANDS, StartCommand)
        for _ in range(3):
            await state.on_tick()
        before = state.to_record(state.clock())
    async with split_stride(bus, settings) as state:
        after = state.to_record(before.updated_at)
        assert after.model_dump(exclude={"updated_at"}) == before.model_dump(exclude={"updated_at"})
        await state.on_tick()
    ticks = probe.payloads(SCHED, QuantumTicked)
    assert [t.quantum for t in ticks] == [0, 1, 2, 3]
    # Strict alternation carries on across the restart.
    holders = [str(decisions(probe, q)["v100-0"].running[0]) for q in range(4)]
    assert holders[0] != holders[1] != holders[2] != holders[3]
    stored = await load_stride(await bus.key_value(STRIDE.name))
    assert stored is not None and stored.record.quantum == 4


async def test_a_batch_writes_the_part_of_the_server_it_changed_and_of_no_other(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1), ("v100-1", 1), ("v100-2", 1))
        await admit(probe, state, "alice", "j1")
        (start,) = await probe.wait_for(COMMANDS, StartCommand)
        await started(probe, start)
        kv = await bus.key_value(STRIDE.name)

        async def revisions() -> dict[str, int]:
            found = {}
            for key in await kv.keys():
                entry = await kv.get(key)
                if entry is not None:
                    found[key] = entry.revision
            return found

        await eventually(lambda: state.machine.jobs["alice.j1"].stays[start.node_id].holds_gpus)
        await probe.drained()
        before = await revisions()
        lost = next(n for n in ("v100-0", "v100-1", "v100-2") if n != start.node_id)
        await probe.publish(NodeFailed(node_id=lost, reason="no heartbeats"))
        await eventually(lambda: state.inventory.get(lost).state is NodeState.FAILED)  # type: ignore[union-attr]
        await probe.drained()
        after = await revisions()
        held = state.to_record(state.clock())
    rewritten = {key for key in after if after[key] != before.get(key)}
    assert f"server.{lost}" in rewritten
    assert not {key for key in rewritten if key.startswith(("server.", "job."))} - {
        f"server.{lost}"
    }
    stored = await load_stride(kv)
    assert stored is not None
    assert stored.record.servers == held.servers
    assert stored.record.servers[lost].state is NodeState.FAILED


async def test_a_job_waiting_across_a_restart_starts_from_what_its_admission_carried(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    """Placement's bucket holds no record of bob's job: its start after the restart comes from
    the admission kept in split-stride's own record, and joins the job's life."""
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1))
        await admit(probe, state, "alice", "a")
        await admit(probe, state, "bob", "b", env={"SEED": "2"}, working_dir="/data")
        (first,) = await probe.wait_for(COMMANDS, StartCommand)
        await started(probe, first)
    async with split_stride(bus, settings) as state:
        await state.on_tick()  # alice's first quantum
        await state.on_tick()  # bob's turn
        (suspend,) = await probe.wait_for(COMMANDS, SuspendCommand)
        await yielded(probe, suspend)
        await probe.wait_for(COMMANDS, StartCommand, lambda found: len(found) == 2)
    (accepted,) = [e for e, d in probe.events("GFAIR_JOBS", JobAccepted) if d.job_id == "b"]
    ((envelope, start),) = [
        (e, d) for e, d in probe.events(COMMANDS, StartCommand) if d.job_id == "b"
    ]
    assert (start.command, start.env, start.working_dir) == (
        ("python", "-c", "pass"),
        {"SEED": "2"},
        "/data",
    )
    assert envelope.correlation_id == accepted.correlation_id is not None


async def test_a_job_stored_before_admissions_carried_its_launch_starts_from_its_jobs_record(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    """A record written before `JobAccepted.launch`: the launch of each job it lacks is read
    once from the job's record in placement's bucket, as split-stride loads it."""
    member = ArrayMembership(id="sweep", index=3)
    async with split_stride(bus, settings) as state:
        await admit(probe, state, "alice", "sweep-3", env={"SEED": "3"}, array=member)
        await eventually(lambda: not state._dirty)
    kv = await bus.key_value(STRIDE.name)
    stored = await load_stride(kv)
    assert stored is not None
    ids = dict.fromkeys(("launch", "correlation_id", "trace_parent"))
    old = stored.record.jobs["alice.sweep-3"].model_copy(update=ids)
    legacy = stored.record.model_copy(update={"jobs": {old.key: old}})
    await save_stride(kv, legacy, stored.revision, None)
    data = submitted("alice", "sweep-3", env={"SEED": "3"}, array=member)
    submission = Envelope.wrap(data, source="test")
    await save_job(await bus.key_value(JOBS.name), JobRecord.accepted(submission, data), None)
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1))
        await state.on_tick()
        await probe.wait_for(COMMANDS, StartCommand)
    ((envelope, start),) = probe.events(COMMANDS, StartCommand)
    assert start.env == {"SEED": "3", **array_environment(member)}
    assert envelope.correlation_id == submission.id


async def test_a_batch_writes_the_job_it_changed_and_looks_at_no_other_and_a_crash_loses_none(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The machine names the jobs a batch changed (`take_changed`): a write stores those, and
    # neither stores nor looks at any other (at 20,000 jobs, telling each job's state apart
    # at every write was a quarter of split-stride's CPU).

    async def revision(key: str) -> int:
        entry = await (await bus.key_value(STRIDE.name)).get(f"job.{key}")
        assert entry is not None
        return entry.revision

    with pytest.raises(RuntimeError, match="crash"):
        async with split_stride(bus, settings) as state:
            await register(probe, state, ("v100-0", 1), ("v100-1", 1))
            await admit(probe, state, "alice", "a")
            await admit(probe, state, "bob", "b")
            await eventually(lambda: len(starts(probe)) == 2)
            await eventually(lambda: not state._dirty)
            was = {key: await revision(key) for key in ("alice.a", "bob.b")}
            looked: list[str] = []
            signature = SchedulerJob.signature

            def counted(job: SchedulerJob) -> tuple[object, ...]:
                looked.append(job.key)
                return signature(job)

            monkeypatch.setattr(SchedulerJob, "signature", counted)
            (start,) = [s for s in starts(probe) if s.job_id == "a"]
            await started(probe, start)  # alice/a's start confirmed: its residency runs
            await eventually(lambda: state.machine.jobs["alice.a"].stays[start.node_id].phase
                             is Phase.RUNNING)  # fmt: skip
            await eventually(lambda: not state._dirty)
            assert await revision("alice.a") > was["alice.a"]
            assert await revision("bob.b") == was["bob.b"]
            assert looked == []
            before = state.to_record(state.clock())
            raise RuntimeError("crash")  # the runtime is aborted where it stands
    async with split_stride(bus, settings) as state:
        after = state.to_record(before.updated_at)
    assert after.model_dump(exclude={"updated_at"}) == before.model_dump(exclude={"updated_at"})


async def test_a_restarted_split_stride_decides_when_the_quantum_it_took_over_ends(
    bus: InMemoryBus, probe: Probe, tmp_path: Path
) -> None:
    # A quantum of 60 s: coming back a whole quantum after a restart would leave the cluster
    # undecided for up to twice that.
    settings = SplitStrideSettings(quantum_s=60.0, checkpoint_root=tmp_path / "ck")
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1))
        await state.on_tick()
        last = state.machine.last_tick_at
    assert last is not None
    ticked = datetime.fromtimestamp(last, UTC)
    # Back 59.5 s into that quantum (by its clock): the next tick is due in half a second.
    later = SplitStrideService(settings, clock=lambda: ticked + timedelta(seconds=59.5))
    async with ServiceRuntime(later.service(), bus, settings=FAST):
        await probe.wait_for(SCHED, QuantumTicked, lambda found: len(found) == 2, timeout_s=5.0)
    assert [t.quantum for t in probe.payloads(SCHED, QuantumTicked)] == [0, 1]


async def test_usage_counts_gpu_seconds_per_user_and_pool(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 4))
        await admit(probe, state, "alice", "a", 3)
        await admit(probe, state, "bob", "b", 1)
        for start in await probe.wait_for(COMMANDS, StartCommand, lambda found: len(found) == 2):
            await started(probe, start)
        await eventually(lambda: phases(state) == {Phase.RUNNING})
        # The jobs hold their GPUs a while: what is charged.
        await consistently(lambda: phases(state) == {Phase.RUNNING}, 0.2)
        await state.on_tick()
        # Held since they started, before the first tick: counted too.
        assert state.machine.meter.seconds["bob"]["v100"] >= 0.2
        await consistently(lambda: phases(state) == {Phase.RUNNING}, 0.3)
        await state.on_tick()
        usage = state.machine.meter.seconds
    assert set(usage) == {"alice", "bob"} and set(usage["alice"]) == {"v100"}
    assert usage["alice"]["v100"] == pytest.approx(3 * usage["bob"]["v100"], rel=0.1)
    assert usage["bob"]["v100"] >= 0.5


def phases(state: SplitStrideService) -> set[Phase]:
    return {stay.phase for job in state.machine.jobs.values() for stay in job.stays.values()}


async def test_each_gpu_second_of_a_switch_is_charged_once_to_whoever_held_it(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    # The quantum gives alice's GPU to bob; alice's job takes 0.4 s to let go, and bob's starts
    # only then. Alice pays those seconds (she held the GPU); bob is given them back (the
    # quantum charged him for them): charged to both, bob would receive less than his share.
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1))
        await admit(probe, state, "alice", "a")
        (start,) = await probe.wait_for(COMMANDS, StartCommand)
        await started(probe, start)
        await admit(probe, state, "bob", "b")
        await eventually(tick_until_suspended(state, probe), interval_s=0.05)
        (bobs,) = [s for s in starts(probe) if s.job_id == "b"]
        # Alice's job takes a while to yield: meanwhile it holds her GPU.
        await consistently(lambda: state.machine.jobs["alice.a"].stays, 0.4)
        await probe.publish(
            JobSuspended(
                user="alice",
                job_id="a",
                node_id="v100-0",
                attempt=1,
                reason=SuspendReason.TIME_SLICE,
            )
        )
        await started(probe, bobs)
        await eventually(lambda: phases(state) == {Phase.RUNNING})
        overrun = state.machine.meter.overrun["alice"]["v100"]
        unheld = state.machine.meter.unheld["bob"]["v100"]
        before = state.machine.users["bob"].credit["v100"]
        quantum = state.machine.quantum
        await state.on_tick()
        after = state.machine.users["bob"].credit["v100"]
        entitled = state.machine.users["bob"].entitled["v100"]
        ran = sum(1.0 for job in decisions(probe, quantum)["v100-0"].running if job.user == "bob")
    assert overrun >= 0.4
    assert unheld == pytest.approx(overrun, abs=0.1)  # the same seconds, given back to bob
    assert not state.machine.meter.unheld  # booked at the tick
    assert after == pytest.approx(before + entitled - ran + unheld / settings.quantum_s)


async def test_a_job_ending_mid_quantum_is_charged_until_it_ended(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1))
        await admit(probe, state, "alice", "a")
        (start,) = await probe.wait_for(COMMANDS, StartCommand)
        await started(probe, start)
        await eventually(lambda: phases(state) == {Phase.RUNNING})
        await state.on_tick()
        held = state.machine.meter.seconds["alice"]["v100"]
        await consistently(lambda: phases(state) == {Phase.RUNNING}, 0.3)
        await probe.publish(completed_on("v100-0", "a"))
        await eventually(lambda: not state.machine.jobs["alice.a"].stays)
        # Ended, the job holds nothing until the tick: what it is charged stops at its end.
        await consistently(lambda: not state.machine.jobs["alice.a"].stays, 0.3)
        await state.on_tick()
        charged = state.machine.meter.seconds["alice"]["v100"] - held
    assert 0.3 <= charged < 0.55  # up to its end, not to the tick after it


async def test_a_repeated_placement_is_handled_once(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 2))
        await admit(probe, state, "alice", "j1")
        (first,) = await probe.wait_for(COMMANDS, StartCommand)
        placed = JobPlaced(user="alice", job_id="j1", servers=("v100-0",), generation="v100")
        envelope = Envelope.wrap(placed, source="test")
        await state.on_job_event(envelope, placed)
        await state.on_job_event(envelope, placed)
        await probe.drained()
    assert starts(probe) == [first]


async def test_a_job_holding_its_gpus_past_its_suspend_is_charged_for_them(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1))
        await admit(probe, state, "alice", "a")
        (start,) = await probe.wait_for(COMMANDS, StartCommand)
        await started(probe, start)
        await admit(probe, state, "bob", "b")
        # Bob's turn comes within two quanta.
        await eventually(tick_until_suspended(state, probe), interval_s=0.05)
        (suspend,) = suspends(probe)
        # The node kills a job that does not yield within the grace the command carries.
        assert suspend.job_id == "a" and suspend.yield_grace_s == settings.yield_grace
        # Alice's job ignores it a while, holding her GPU.
        await consistently(lambda: state.machine.jobs["alice.a"].stays, 0.4)
        await probe.publish(
            JobSuspended(
                user="alice",
                job_id="a",
                node_id="v100-0",
                attempt=1,
                reason=SuspendReason.TIME_SLICE,
                forced=True,
            )
        )
        await eventually(lambda: not state.machine.jobs["alice.a"].stays)
        held = state.machine.meter.overrun["alice"]["v100"]
        before = state.machine.users["alice"].credit["v100"]
        quantum = state.machine.quantum
        await state.on_tick()
        after = state.machine.users["alice"].credit["v100"]
        entitled = state.machine.users["alice"].entitled["v100"]
        running = decisions(probe, quantum)["v100-0"].running
    ran = sum(1.0 for job in running if job.user == "alice")
    assert held >= 0.4  # GPU-seconds, from the suspend to the node's report
    assert not state.machine.meter.overrun  # booked at the tick
    # Her credit grew by her entitlement less what she ran and what she held past the suspend.
    assert after == pytest.approx(before + entitled - ran - held / settings.quantum_s)


def prepared(user: str, job_id: str, node_id: str) -> JobSuspended:
    """A node's report that the job's prepared process parked there."""
    return JobSuspended(
        user=user,
        job_id=job_id,
        node_id=node_id,
        attempt=1,
        reason=SuspendReason.PREPARED,
        in_place=True,
    )


async def test_an_opted_in_job_waiting_for_gpus_starts_prepared_and_then_runs_there(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1), ("v100-1", 1))
        await admit(probe, state, "alice", "a")
        await admit(probe, state, "alice", "b")
        await probe.wait_for(COMMANDS, StartCommand, lambda found: len(found) == 2)
        await admit(probe, state, "bob", "w", prepare=True)
        await admit(probe, state, "bob", "x")  # did not opt in
        (prepare,) = await probe.wait_for(COMMANDS, PrepareCommand)
        assert (prepare.node_id, prepare.generation, prepare.gpus) == ("v100-0", "v100", 1)
        assert prepare.command == ("python", "-c", "pass")
        assert prepare.checkpoint_dir == str(settings.checkpoint_root / "bob" / "w")
        await probe.publish(prepared("bob", "w", "v100-0"))
        await eventually(lambda: state.machine.jobs["bob.w"].parked == ("v100-0", ()))
        for command in starts(probe):
            await started(probe, command)
        for _ in range(3):
            await state.on_tick()
            if any(s.job_id == "w" for s in starts(probe)):
                break
    (start,) = [s for s in starts(probe) if s.job_id == "w"]
    assert start.node_id == "v100-0"  # where its process waits, parked
    # Nothing told that node to let it go, and nobody else was prepared.
    assert not [s for s in suspends(probe) if s.job_id == "w"]
    assert len(probe.payloads(COMMANDS, PrepareCommand)) == 1


async def test_a_server_prepares_no_more_waiting_jobs_than_it_has_gpus(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    # A burst of opted-in submissions must not start a process per job on one server at once.
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1))
        await admit(probe, state, "alice", "a")
        await probe.wait_for(COMMANDS, StartCommand)
        for name in ("w", "v", "u"):
            await admit(probe, state, "bob", name, prepare=True)
        await eventually(lambda: {"bob.w", "bob.v", "bob.u"} <= state.machine.jobs.keys())
        await probe.wait_for(COMMANDS, PrepareCommand)
    assert [p.job_id for p in probe.payloads(COMMANDS, PrepareCommand)] == ["w"]


async def test_a_prepared_job_started_elsewhere_or_cancelled_is_let_go_where_it_waits(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 2))
        await admit(probe, state, "alice", "a")
        await admit(probe, state, "alice", "a2")
        await probe.wait_for(COMMANDS, StartCommand, lambda found: len(found) == 2)
        await admit(probe, state, "bob", "w", prepare=True)
        await admit(probe, state, "bob", "v", prepare=True)
        await probe.wait_for(COMMANDS, PrepareCommand, lambda found: len(found) == 2)
        # w parks; v's park is reported only after it was cancelled.
        await probe.publish(prepared("bob", "w", "v100-0"))
        await eventually(lambda: state.machine.jobs["bob.w"].parked is not None)
        await probe.publish(JobCancelled(user="bob", job_id="w", previous_state=JobState.SUSPENDED))
        await probe.publish(JobCancelled(user="bob", job_id="v", previous_state=JobState.SUSPENDED))
        await eventually(lambda: "bob.v" not in state.machine.jobs)
        await probe.publish(prepared("bob", "v", "v100-0"))
        await probe.wait_for(COMMANDS, SuspendCommand)
        await probe.wait_for(COMMANDS, KillCommand)
    (kill,) = probe.payloads(COMMANDS, KillCommand)
    assert (kill.job_id, kill.node_id) == ("w", "v100-0")
    (release,) = suspends(probe)
    assert (release.job_id, release.node_id, release.reason) == (
        "v",
        "v100-0",
        SuspendReason.MIGRATION,
    )


async def test_a_restarted_split_stride_knows_which_processes_wait_prepared_or_parked(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    """The processes outlive split-stride's restart: one still coming up counts against its
    server's prepared starts, and a cancelled job's parked process is killed where it waits."""
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1), ("v100-1", 1))
        await admit(probe, state, "alice", "a")
        await admit(probe, state, "alice", "a2")
        await probe.wait_for(COMMANDS, StartCommand, lambda found: len(found) == 2)
        await admit(probe, state, "bob", "w", prepare=True)
        await admit(probe, state, "bob", "v", prepare=True)
        await probe.wait_for(COMMANDS, PrepareCommand, lambda found: len(found) == 2)
        await probe.publish(prepared("bob", "w", "v100-0"))  # v still comes up on v100-1
        await eventually(lambda: state.machine.jobs["bob.w"].parked is not None)
    async with split_stride(bus, settings) as state:
        # Each server has as many prepared processes waiting as GPUs: nobody else is prepared.
        await admit(probe, state, "bob", "u", prepare=True)
        await probe.publish(JobCancelled(user="bob", job_id="w", previous_state=JobState.SUSPENDED))
        await probe.wait_for(COMMANDS, KillCommand)
    assert [p.job_id for p in probe.payloads(COMMANDS, PrepareCommand)] == ["w", "v"]
    (kill,) = probe.payloads(COMMANDS, KillCommand)
    assert (kill.job_id, kill.node_id) == ("w", "v100-0")


# ----- the record in gfair_stride: a key per job ---------------------------------------------


async def revisions(bus: InMemoryBus) -> dict[str, int]:
    kv = await bus.key_value(STRIDE.name)
    found = {}
    for key in await kv.keys():
        entry = await kv.get(key)
        assert entry is not None
        found[key] = entry.revision
    return found


def comparable(state: SplitStrideService, record: StrideRecord) -> dict[str, object]:
    return state.to_record(record.updated_at).model_dump()


async def three_jobs(probe: Probe, state: SplitStrideService, gpus: int) -> None:
    """Alice's, bob's and carol's job "a" admitted on one server of `gpus` GPUs."""
    await register(probe, state, ("v100-0", gpus))
    for user in ("alice", "bob", "carol"):
        await admit(probe, state, user, "a")


async def test_each_job_has_its_key_and_a_batch_rewrites_only_the_jobs_it_changed(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await three_jobs(probe, state, 4)
        commands = await probe.wait_for(COMMANDS, StartCommand, lambda found: len(found) == 3)
        await state.on_tick()
        before = await revisions(bus)
        assert {"job.alice.a", "job.bob.a", "job.carol.a", "server.v100-0"} <= set(before)
        kv = await bus.key_value(STRIDE.name)
        entry = await kv.get(STATE_KEY)
        assert entry is not None and StrideRecord.from_bytes(entry.value).jobs == {}
        alice = next(c for c in commands if c.user == "alice")
        await started(probe, alice)  # alice's job runs: only its record changes
        await eventually(
            lambda: state.machine.jobs["alice.a"].stays["v100-0"].phase.value == "running"
        )
        await probe.drained()
        after = await revisions(bus)
        rewritten = {key for key in after if after[key] != before.get(key)}
        assert rewritten == {"state", "log.0", "job.alice.a"}
        held = state.to_record(state.clock())
    async with split_stride(bus, settings) as state:
        assert comparable(state, held) == held.model_dump()


async def test_a_one_key_record_is_stored_per_job_and_read_back_after_a_restart(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await three_jobs(probe, state, 2)
        await state.on_tick()
        old = state.to_record(state.clock())
    # The bucket as split-stride left it before it stored jobs apart: one key, every job in it.
    kv = await bus.key_value(STRIDE.name)
    for key in await kv.keys():
        await kv.delete(key)
    await kv.put(STATE_KEY, old.to_bytes())
    async with split_stride(bus, settings) as state:
        assert comparable(state, old) == old.model_dump()
        await probe.drained()
        await state.on_tick()  # stored at the latest with the next write
        jobs = {key for key in await kv.keys() if key.startswith("job.")}
        assert jobs == {"job.alice.a", "job.bob.a", "job.carol.a"}
        held = state.to_record(state.clock())
    async with split_stride(bus, settings) as state:
        assert comparable(state, held) == held.model_dump()
        assert set(state.machine.jobs) == set(old.jobs)


async def test_a_batch_of_reports_that_let_go_is_handed_in_together_with_one_fill(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    recording = Recording()
    state = SplitStrideService(settings, journal=recording)
    async with ServiceRuntime(state.service(), bus, settings=FAST):
        await register(probe, state, ("v100-0", 4))
        for n in range(4):
            await admit(probe, state, "alice", f"a{n}")
        first = await probe.wait_for(COMMANDS, StartCommand, lambda found: len(found) == 4)
        for command in first:
            await started(probe, command)
        for n in range(4):
            await admit(probe, state, "bob", f"b{n}")  # no GPU idle: they wait
        # The four processes end together: their node's reports come in one batch.
        await asyncio.gather(*(probe.publish(completed_on("v100-0", f"a{n}")) for n in range(4)))
        later = await probe.wait_for(COMMANDS, StartCommand, lambda found: len(found) == 8)
    assert sorted(c.job_id for c in later[4:]) == ["b0", "b1", "b2", "b3"]
    assert not any(isinstance(given, Exited) for given in recording.inputs)
    handed = [given for given in recording.inputs if isinstance(given, Releases)]
    assert sorted(r.job_id for given in handed for r in given.reports) == ["a0", "a1", "a2", "a3"]
    # One fill for the batch: its reply starts all four waiting jobs.
    assert len(handed) == 1 and len(handed[0].reports) == 4


class _BusyBroker(InMemoryBus):
    """A broker too busy to acknowledge the first `refusals` publishes of commands."""

    def __init__(self) -> None:
        super().__init__()
        self.refusals = 0

    async def publish(self, subject: str, payload: bytes, **options: Any) -> PubAck:
        if ".cmd." in subject and self.refusals > 0:
            self.refusals -= 1
            raise PublishFailed(f"publish to {subject!r} not acknowledged")
        return await super().publish(subject, payload, **options)


async def test_a_command_the_broker_is_slow_to_store_is_sent_again_not_decided_again(
    settings: SplitStrideSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A quantum whose commands the broker did not acknowledge in time was decided again from
    # the last record: under overload, twice the work the broker was already short of.
    monkeypatch.setattr(publisher, "AGAIN_AFTER_S", 0.01)
    bus = _BusyBroker()
    probe = Probe(bus)
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1))
        await admit(probe, state, "alice", "a")
        await admit(probe, state, "bob", "b")
        await started(probe, (await probe.wait_for(COMMANDS, StartCommand))[0])
        await eventually(lambda: not state._dirty)
        loads = state._loads
        bus.refusals = 2
        for _ in range(4):  # until a's turn ends
            await state.on_tick()
            if suspends(probe):
                break
        assert state._loads == loads  # not reloaded from the record
    assert bus.refusals == 0  # refused twice, then stored
    (suspend,) = suspends(probe)  # each command stored once
    assert (suspend.job_id, suspend.reason) == ("a", SuspendReason.TIME_SLICE)
    ticks = [t.quantum for t in probe.payloads(SCHED, QuantumTicked)]
    assert ticks == list(range(len(ticks)))  # each quantum decided once


async def test_an_unreadable_state_is_dead_lettered_and_placements_jobs_start_afresh(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    """Issue 41: a JetStream ack written over the state (`{"stream": ..., "seq": ...}`) made
    split-stride fail every quantum and crash-loop after a restart: no job started anywhere."""
    await bus.ensure_topology(cluster_topology())
    data = submitted("alice", "a")
    envelope = Envelope.wrap(data, source="test")
    await save_job(await bus.key_value(JOBS.name), JobRecord.accepted(envelope, data), None)
    garbage = b'{"stream":"GFAIR_JOBS","seq":35}'
    await (await bus.key_value(STRIDE.name)).put(STATE_KEY, garbage)
    async with split_stride(bus, settings) as state:
        assert "alice.a" in state.machine.jobs
        await register(probe, state, ("v100-0", 1))
        await state.on_tick()
        [start] = await probe.wait_for(COMMANDS, StartCommand)
        assert (start.user, start.job_id) == ("alice", "a")
    letters = [DeadLetter.model_validate_json(m.data) for m in bus.stream_messages("GFAIR_DLQ")]
    assert [(d.reason, d.subject, d.original_payload()) for d in letters] == [
        (DeadLetterReason.UNREADABLE_RECORD, f"$KV.{STRIDE.name}.{STATE_KEY}", garbage)
    ]
    # What it wrote since is a record again: the next start reads it.
    stored = await load_stride(await bus.key_value(STRIDE.name))
    assert stored is not None and "alice.a" in stored.record.jobs


def test_a_jobs_time_limit_and_running_time_survive_its_record() -> None:
    launch = Launch(("train",), {"A": "1"}, "/work", correlation_id="corr", time_limit=90.0)
    job = SchedulerJob("alice", "a", 2, 1.0, None, 1, launch=launch, ran_s=12.5)
    back = stride_record._job(stride_record._record(job))
    assert (back.launch, back.ran_s) == (launch, 12.5)
