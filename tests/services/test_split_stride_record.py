"""Split-stride's record in `gfair_stride`: a key per job, what a batch changed, restarts."""

from __future__ import annotations

from pathlib import Path

import pytest

from gfair.bus.memory_bus import InMemoryBus
from gfair.events.commands import StartCommand
from gfair.state.buckets import STRIDE
from gfair.state.stride_record import STATE_KEY, StrideRecord
from gfair_services.split_stride import Settings, SplitStrideService

from .scheduling_harness import Probe, eventually
from .test_split_stride import COMMANDS, NEVER, admit, register, split_stride, started


@pytest.fixture
def bus() -> InMemoryBus:
    return InMemoryBus()


@pytest.fixture
def probe(bus: InMemoryBus) -> Probe:
    return Probe(bus)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(quantum_s=NEVER, checkpoint_root=tmp_path / "ck")


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


async def test_each_job_has_its_key_and_a_batch_rewrites_only_the_jobs_it_changed(
    bus: InMemoryBus, probe: Probe, settings: Settings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 4))
        for user in ("alice", "bob", "carol"):
            await admit(probe, state, user, "a")
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
        await probe.settle(0.1)
        after = await revisions(bus)
        rewritten = {key for key in after if after[key] != before.get(key)}
        assert rewritten == {"state", "log.0", "job.alice.a"}
        held = state.to_record(state.clock())
    async with split_stride(bus, settings) as state:
        assert comparable(state, held) == held.model_dump()


async def test_a_one_key_record_is_stored_per_job_and_read_back_after_a_restart(
    bus: InMemoryBus, probe: Probe, settings: Settings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 2))
        for user in ("alice", "bob", "carol"):
            await admit(probe, state, user, "a")
        await state.on_tick()
        old = state.to_record(state.clock())
    # The bucket as split-stride left it before it stored jobs apart: one key, every job in it.
    kv = await bus.key_value(STRIDE.name)
    for key in await kv.keys():
        await kv.delete(key)
    await kv.put(STATE_KEY, old.to_bytes())
    async with split_stride(bus, settings) as state:
        assert comparable(state, old) == old.model_dump()
        await probe.settle(0.1)
        await state.on_tick()  # stored at the latest with the next write
        jobs = {key for key in await kv.keys() if key.startswith("job.")}
        assert jobs == {"job.alice.a", "job.bob.a", "job.carol.a"}
        held = state.to_record(state.clock())
    async with split_stride(bus, settings) as state:
        assert comparable(state, held) == held.model_dump()
        assert set(state.machine.jobs) == set(old.jobs)
