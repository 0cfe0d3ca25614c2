"""A start the node refused does not hold a job back for the long release timeout.

Split-stride starts a job on a K80 (the V100 is taken), and at the next quantum boundary, the
V100 free again, the kernel moves it there before the K80's node confirmed the start. If that
node refused the start (it read it past its `valid_until`), the suspend
that follows finds nothing to suspend: the node answers neither. Split-stride forgets such a
stop after `unconfirmed_release_s`, not the long `release_timeout_s` it keeps for suspends of
jobs that did start.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.publisher import EventPublisher
from gfair.bus.runtime import ServiceRuntime
from gfair.events.codec import decode
from gfair.events.commands import StartCommand, SuspendCommand
from gfair.events.envelope import Envelope, EventData
from gfair.events.jobs import JobAccepted, JobCompleted, JobLaunch, JobStarted
from gfair.events.nodes import GpuInfo, NodeRegistered
from gfair.events.reasons import SuspendReason
from gfair.events.subjects import COMMANDS_STREAM
from gfair.events.submission import JobSubmitted
from gfair.state.buckets import JOBS
from gfair.state.job_record import JobRecord, save_job
from gfair_services.split_stride import SplitStrideService, SplitStrideSettings
from support.waiting import consistently, eventually

from .live_services import FAST

QUANTUM_S = 0.1
REFUSED_AFTER_S = 0.6
NEVER_S = 3600.0


def node(node_id: str) -> NodeRegistered:
    generation = node_id.split("-")[0]
    gpu = GpuInfo(
        index=0, uuid=f"GPU-{node_id}", name=generation, generation=generation, memory_bytes=1 << 34
    )
    return NodeRegistered(node_id=node_id, hostname=node_id, gpus=(gpu,), heartbeat_interval_s=1)


class Split:
    def __init__(self, bus: InMemoryBus, state: SplitStrideService) -> None:
        self.bus = bus
        self.state = state
        self.tool = EventPublisher(bus, "test")

    async def publish(self, data: EventData) -> None:
        await self.tool.publish(data)

    def commands(self) -> list[EventData]:
        return [decode(m.data).data for m in self.bus.stream_messages(COMMANDS_STREAM.name)]

    async def until(self, check: Callable[[], bool], timeout_s: float) -> float:
        began = time.monotonic()
        try:
            await eventually(check, timeout_s)
        except AssertionError as failed:
            raise AssertionError(f"{failed}; commands: {self.commands()}") from None
        return time.monotonic() - began

    async def admit(self, job_id: str) -> None:
        """What placement does: the record first, then the announcement."""
        data = JobSubmitted(user="alice", job_id=job_id, gpus=1, command=("train",))
        envelope = Envelope.wrap(data, source="test")
        kv = await self.bus.key_value(JOBS.name)
        await save_job(kv, JobRecord.accepted(envelope, data), None)
        await self.publish(
            JobAccepted(user="alice", job_id=job_id, gpus=1, launch=JobLaunch(command=("true",)))
        )

    def starts_on(self, node_id: str) -> list[StartCommand]:
        return [c for c in self.commands() if isinstance(c, StartCommand) and c.node_id == node_id]


@pytest.fixture
async def split(tmp_path: Path) -> AsyncIterator[Split]:
    bus = InMemoryBus()
    settings = SplitStrideSettings(
        quantum_s=QUANTUM_S,
        checkpoint_root=tmp_path,
        unconfirmed_release_s=REFUSED_AFTER_S,
        release_timeout_s=NEVER_S,
        # Moves cost nothing here: at 0.1 s quanta the default 3 s would keep j on the K80.
        migration_cost_s=0.0,
    )
    state = SplitStrideService(settings)
    async with ServiceRuntime(state.service(), bus, settings=FAST):
        found = Split(bus, state)
        for node_id in ("v100-0", "k80-0"):
            await found.publish(node(node_id))
        await found.until(lambda: len(state.inventory) == 2, 5)
        yield found


async def moved_while_starting(split: Split) -> None:
    await split.admit("first")
    await split.until(lambda: bool(split.starts_on("v100-0")), 5)
    await split.admit("j")
    await split.until(lambda: bool(split.starts_on("k80-0")), 5)
    # The V100 frees up: the next quantum moves j there (the move races its start).
    await split.publish(JobCompleted(user="alice", job_id="first", attempt=1))
    await split.until(
        lambda: any(
            isinstance(c, SuspendCommand) and c.reason is SuspendReason.MIGRATION
            for c in split.commands()
        ),
        5,
    )


def starts_of_j(split: Split, node_id: str) -> list[StartCommand]:
    return [c for c in split.starts_on(node_id) if c.job_id == "j"]


async def test_the_stop_of_a_start_never_confirmed_is_forgotten_soon(split: Split) -> None:
    await moved_while_starting(split)
    waited = await split.until(lambda: bool(starts_of_j(split, "v100-0")), 10 * REFUSED_AFTER_S)
    assert waited < 5 * REFUSED_AFTER_S


async def test_a_job_that_did_start_waits_for_its_node_to_let_go(split: Split) -> None:
    await moved_while_starting(split)
    (start,) = split.starts_on("k80-0")
    await split.publish(
        JobStarted(
            user="alice", job_id="j", node_id="k80-0", gpu_indices=start.gpu_indices, attempt=1
        )
    )
    # It runs on k80-0 until that node confirms the suspend: it must not start elsewhere.
    await consistently(lambda: starts_of_j(split, "v100-0") == [], 4 * REFUSED_AFTER_S)
