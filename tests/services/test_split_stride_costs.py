"""Split-stride charges each job what its switches measured (the profiler's `SwitchCostsUpdated`)
in the kernel's snapshot, the operator's settings until then and its move cost as a floor."""

from __future__ import annotations

from pathlib import Path

import pytest

from gfair.bus.memory_bus import InMemoryBus
from gfair.core.kernel import RunnableJob
from gfair.events.commands import StartCommand
from gfair.events.jobs import JobSuspended
from gfair.events.reasons import SuspendReason
from gfair.events.scheduling import SwitchCostsUpdated
from gfair_services.split_stride import SplitStrideService, SplitStrideSettings
from support.waiting import eventually

from .scheduling_harness import Probe
from .test_split_stride import COMMANDS, NEVER, admit, register, split_stride, started

# Every machine these tests make checks its index after every input.
pytestmark = pytest.mark.usefixtures("checked_machines")


@pytest.fixture
def bus() -> InMemoryBus:
    return InMemoryBus()


@pytest.fixture
def probe(bus: InMemoryBus) -> Probe:
    return Probe(bus)


@pytest.fixture
def settings(tmp_path: Path) -> SplitStrideSettings:
    return SplitStrideSettings(
        quantum_s=NEVER,
        checkpoint_root=tmp_path / "ck",
        migration_cost_s=20.0,
        resume_cost_s=0.5,
    )


def charged(state: SplitStrideService, user: str = "alice") -> RunnableJob:
    """The job of `user` as the kernel's snapshot shows it."""
    (job,) = state.machine.snapshot(state.clock().timestamp()).jobs[user]
    return job


async def measured(
    probe: Probe, state: SplitStrideService, reports: int, **seconds: float | None
) -> None:
    await probe.publish(SwitchCostsUpdated(user="alice", job_id="a", reports=reports, **seconds))
    await eventually(lambda: probe.bus.backlog() == 0)


async def test_a_jobs_measured_switches_are_what_the_kernel_weighs(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1))
        await admit(probe, state, "alice", "a")
        # Nothing measured yet: the operator's.
        before = charged(state)
        assert (before.move_s, before.resume_s) == (20.0, 0.5)

        await measured(probe, state, 3, yield_s=1.5, resume_in_place_s=0.25, cold_start_s=40.0)
        job = charged(state)
        # Dearer than the operator's floor: the measured move. Not parked in place, its resume
        # is a new process from its checkpoint too.
        assert job.move_s == pytest.approx(41.5)
        assert job.resume_s == pytest.approx(41.5)

        # Its node parks it in place: it resumes there in a quarter second.
        (start,) = await probe.wait_for(COMMANDS, StartCommand)
        await started(probe, start)
        await probe.publish(
            JobSuspended(
                user="alice",
                job_id="a",
                node_id="v100-0",
                attempt=1,
                reason=SuspendReason.TIME_SLICE,
                duration_s=1.5,
                in_place=True,
            )
        )
        await eventually(lambda: state.machine.jobs["alice.a"].parked is not None)
        job = charged(state)
        assert job.resume_s == pytest.approx(1.75)
        assert job.move_s == pytest.approx(41.5)

        # An older estimate delivered late changes nothing.
        await measured(probe, state, 2, yield_s=9.0, cold_start_s=9.0)
        assert charged(state).move_s == pytest.approx(41.5)

        # Cheaper than what the operator says a move costs: the floor holds (the network and
        # a cold cache elsewhere are not measured).
        await measured(probe, state, 5, yield_s=1.0, resume_in_place_s=0.25, cold_start_s=4.0)
        job = charged(state)
        assert job.move_s == 20.0
        assert job.resume_s == pytest.approx(1.25)

    # A restarted split-stride keeps them, and that the job's process waits parked in place.
    async with split_stride(bus, settings) as state:
        job = charged(state)
        assert job.move_s == 20.0
        assert job.resume_s == pytest.approx(1.25)


async def test_part_measured_costs_fall_back_to_the_operators(
    bus: InMemoryBus, probe: Probe, settings: SplitStrideSettings
) -> None:
    async with split_stride(bus, settings) as state:
        await register(probe, state, ("v100-0", 1))
        await admit(probe, state, "alice", "a")
        # A first start measured its cold start, no suspend its yield yet.
        await measured(probe, state, 1, cold_start_s=40.0)
        job = charged(state)
        assert (job.move_s, job.resume_s) == (20.0, 0.5)
