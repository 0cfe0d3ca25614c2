"""The profiler service on the in-memory bus: measurements in, throttled profiles out."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.runner import RunnerSettings
from gfair.events.envelope import Envelope
from gfair.events.jobs import (
    JobAccepted,
    JobCompleted,
    JobLaunch,
    JobProgress,
    JobResumed,
    JobSuspended,
)
from gfair.events.reasons import SuspendReason
from gfair.events.scheduling import ProfileUpdated, SwitchCostsUpdated
from gfair.state.buckets import PROFILES
from gfair.state.profile_record import (
    GENERATIONS_KEY,
    GenerationsRecord,
    JobProfileRecord,
    TypeProfileRecord,
    job_profile_key,
    type_key,
    type_profile_key,
)
from gfair_services.profiler import Settings, build_service
from gfair_services.profiler.profile_book import ProfileBook
from support.waiting import eventually

from .scheduling_harness import ServiceHarness, registered

FAST = RunnerSettings(batch=10, fetch_timeout_s=0.02, error_pause_s=0.02)
RESNET = "ResNet-50 (batch size 32)"
# A seed with a mild speedup, so that what the profiler learns is visibly not the seed.
SEED = {RESNET: {"k80": 2.0, "v100": 4.0}}


def accepted(job_id: str, gpus: int = 1) -> JobAccepted:
    return JobAccepted(
        user="alice", job_id=job_id, gpus=gpus, job_type=RESNET, launch=JobLaunch(command=("true",))
    )


def progress(
    job_id: str,
    generation: str,
    rate: float,
    iterations: int,
    *,
    user: str = "alice",
    attempt: int = 1,
    first_step_s: float | None = None,
) -> JobProgress:
    return JobProgress(
        user=user,
        job_id=job_id,
        node_id=f"{generation}-0",
        generation=generation,
        attempt=attempt,
        minibatches_per_s=rate,
        iterations=iterations,
        first_step_s=first_step_s,
    )


class Harness(ServiceHarness):
    def __init__(self, bus: InMemoryBus, settings: Settings) -> None:
        super().__init__(bus, lambda: build_service(settings), FAST)
        self.settings = settings

    async def profiles(self) -> list[ProfileUpdated]:
        return [
            ProfileUpdated.model_validate(Envelope.model_validate_json(m.data).data)
            async for m in self.bus.history("GFAIR_SCHED", filter_subjects=("gfair.sched.profile",))
        ]

    async def costs(self) -> list[SwitchCostsUpdated]:
        return [
            SwitchCostsUpdated.model_validate(Envelope.model_validate_json(m.data).data)
            async for m in self.bus.history(
                "GFAIR_SCHED", filter_subjects=("gfair.sched.switch_costs",)
            )
        ]


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    table = tmp_path / "throughputs.json"
    table.write_text(
        json.dumps(
            {
                generation: {f"('{RESNET}', 1)": {"null": rate}}
                for generation, rate in SEED[RESNET].items()
            }
        )
    )
    bus = InMemoryBus()
    found = Harness(bus, Settings(throughputs=table))
    await found.start()
    try:
        yield found
    finally:
        if found.runtime is not None and not found.runtime.stopping:
            await found.stop()
        await bus.close()


async def profiles_eventually(harness: Harness, count: int) -> list[ProfileUpdated]:
    found: list[ProfileUpdated] = []

    async def enough() -> bool:
        found[:] = await harness.profiles()
        return len(found) >= count

    await eventually(enough)
    return found


async def generations_known(harness: Harness, *generations: str) -> None:
    """Until the profiler has taken in the node registrations (a consumer of its own)."""
    kv = await harness.bus.key_value(PROFILES.name)

    async def known() -> bool:
        entry = await kv.get(GENERATIONS_KEY)
        if entry is None:
            return False
        record = GenerationsRecord.model_validate_json(entry.value)
        return set(generations) <= set(record.generations)

    await eventually(known)


async def drained(harness: Harness, job_id: str, iterations: int, user: str = "alice") -> None:
    """Until the job's record shows the report at `iterations` folded in."""
    kv = await harness.bus.key_value(PROFILES.name)

    async def folded() -> bool:
        entry = await kv.get(job_profile_key(user, job_id))
        if entry is None:
            return False
        return JobProfileRecord.model_validate_json(entry.value).last_iterations >= iterations

    await eventually(folded)
    # Its batch settled too: what the report makes the profiler publish is out.
    await eventually(lambda: harness.bus.backlog() == 0)


async def test_learns_different_rates_per_generation_for_one_job_type(harness: Harness) -> None:
    await harness.publish(
        registered("k80-0", "k80"),
        registered("v100-0", "v100"),
        accepted("j1", 2),
    )
    await generations_known(harness, "k80", "v100")
    # A 2-GPU gang: 3 and 18 mini-batches/s, i.e. 1.5 and 9 per GPU, a 6x speedup (seed: 2x).
    await harness.publish(progress("j1", "k80", 3.0, 10), progress("j1", "k80", 3.0, 20))
    await harness.publish(progress("j1", "v100", 18.0, 30), progress("j1", "v100", 18.0, 40))
    await drained(harness, "j1", 40)

    profiles = await harness.profiles()
    user_profiles = [p for p in profiles if p.job_id is None]
    latest = user_profiles[-1]
    assert (latest.user, latest.job_type, latest.baseline) == ("alice", RESNET, "k80")
    assert latest.observed == ("k80", "v100")
    assert latest.rates["k80"] == pytest.approx(1.5)
    assert latest.rates["v100"] == pytest.approx(9.0)
    assert latest.speedups["v100"] == pytest.approx(6.0)
    # Before v100 was measured, the profile scaled the seed's 2x to the k80 measurement.
    first = user_profiles[0]
    assert first.observed == ("k80",)
    assert first.speedups["v100"] == pytest.approx(2.0)
    assert first.rates["k80"] == pytest.approx(1.5)
    job_profiles = [p for p in profiles if p.job_id == "j1"]
    assert job_profiles and job_profiles[-1].speedups["v100"] == pytest.approx(6.0)

    kv = await harness.bus.key_value(PROFILES.name)
    entry = await kv.get(type_profile_key("alice", RESNET))
    assert entry is not None
    record = TypeProfileRecord.model_validate_json(entry.value)
    assert {g: m.samples for g, m in record.measured.items()} == {"k80": 2, "v100": 2}


async def test_publishes_only_when_a_speedup_moves_past_the_threshold(harness: Harness) -> None:
    await harness.publish(registered("k80-0", "k80"), registered("v100-0", "v100"))
    await generations_known(harness, "k80", "v100")
    await harness.publish(
        accepted("j1"),
        progress("j1", "k80", 1.0, 1),
        progress("j1", "v100", 6.0, 2),
    )
    await drained(harness, "j1", 2)
    before = len(await harness.profiles())
    # Same speeds again, and a 3% wobble: nothing worth telling the trading auction.
    await harness.publish(
        progress("j1", "v100", 6.0, 3),
        progress("j1", "k80", 1.0, 4),
        progress("j1", "v100", 6.6, 5),  # running mean 6.18: +3%
    )
    await drained(harness, "j1", 5)
    assert len(await harness.profiles()) == before
    # A slowdown on v100 that drags the mean below 5.7 (-5%) is.
    await harness.publish(progress("j1", "v100", 4.0, 6))
    await drained(harness, "j1", 6)
    after = await harness.profiles()
    assert len(after) > before
    assert after[-1].speedups["v100"] < 6.0 * 0.95


async def test_repeated_and_stale_reports_change_nothing(harness: Harness) -> None:
    await harness.publish(
        registered("k80-0", "k80"),
        accepted("j1"),
    )
    report = Envelope.wrap(progress("j1", "k80", 2.0, 10), source="node")
    again = report  # the same envelope, as a redelivery or a retried publish would carry it
    await harness.tool.publish_envelope(report)
    await harness.tool.publish(progress("j1", "k80", 8.0, 5))  # older step of the same attempt
    await drained(harness, "j1", 10)
    kv = await harness.bus.key_value(PROFILES.name)
    await harness.bus.publish(
        again.subject, again.model_dump_json().encode(), msg_id=f"{again.id}-resent"
    )
    await harness.publish(progress("j1", "k80", 2.0, 11))
    await drained(harness, "j1", 11)
    entry = await kv.get(type_profile_key("alice", RESNET))
    assert entry is not None
    measured = TypeProfileRecord.model_validate_json(entry.value).measured["k80"]
    assert measured.samples == 2
    assert measured.rate == pytest.approx(2.0)


async def test_a_new_generation_in_the_cluster_republishes_profiles(harness: Harness) -> None:
    await harness.publish(registered("k80-0", "k80"))
    await generations_known(harness, "k80")
    await harness.publish(
        accepted("j1"),
        progress("j1", "k80", 1.0, 1),
    )
    first = await profiles_eventually(harness, 2)  # the user's and the job's
    assert {set(p.rates) == {"k80"} for p in first} == {True}
    await harness.publish(registered("a100-0", "a100"))
    later = await profiles_eventually(harness, len(first) + 1)
    assert later[-1].job_id is None
    assert set(later[-1].rates) == {"k80", "a100"}
    assert later[-1].speedups["a100"] > 1  # the generic speeds rank a100 far above k80
    kv = await harness.bus.key_value(PROFILES.name)
    entry = await kv.get(GENERATIONS_KEY)
    assert entry is not None
    assert GenerationsRecord.model_validate_json(entry.value).generations == ("a100", "k80")


async def test_restart_restores_the_book_from_the_bucket(harness: Harness) -> None:
    await harness.publish(registered("k80-0", "k80"), registered("v100-0", "v100"))
    await generations_known(harness, "k80", "v100")
    await harness.publish(
        accepted("j1"),
        progress("j1", "k80", 1.0, 1),
        progress("j1", "v100", 5.0, 2),
    )
    await drained(harness, "j1", 2)
    published = len(await harness.profiles())
    await harness.stop()

    await harness.start()
    # Same speeds as before the restart: the restored profile holds, nothing is republished.
    await harness.publish(progress("j1", "v100", 5.0, 3))
    await drained(harness, "j1", 3)
    assert len(await harness.profiles()) == published
    kv = await harness.bus.key_value(PROFILES.name)
    entry = await kv.get(type_profile_key("alice", RESNET))
    assert entry is not None
    assert TypeProfileRecord.model_validate_json(entry.value).measured["v100"].samples == 2
    # And a replay of an old report is still recognised as stale after the restart.
    await harness.publish(progress("j1", "v100", 50.0, 2), progress("j1", "v100", 5.0, 4))
    await drained(harness, "j1", 4)
    assert len(await harness.profiles()) == published


async def test_finished_jobs_are_forgotten_but_their_user_profile_stays(harness: Harness) -> None:
    await harness.publish(
        registered("k80-0", "k80"),
        accepted("j1"),
        progress("j1", "k80", 1.0, 1),
    )
    await drained(harness, "j1", 1)
    await harness.publish(JobCompleted(user="alice", job_id="j1", attempt=1))
    kv = await harness.bus.key_value(PROFILES.name)

    async def gone() -> bool:
        return await kv.get(job_profile_key("alice", "j1")) is None

    await eventually(gone)
    assert await kv.get(type_profile_key("alice", RESNET)) is not None
    # Progress of a job the profiler does not track (never accepted) is ignored.
    await harness.publish(progress("ghost", "k80", 100.0, 1))
    await harness.publish(accepted("j2"))

    async def j2_tracked() -> bool:
        return await kv.get(job_profile_key("alice", "j2")) is not None

    await eventually(j2_tracked)
    assert await kv.get(job_profile_key("alice", "ghost")) is None


def test_type_keys_are_valid_bucket_keys_and_distinct() -> None:
    keys = {type_key(t) for t in (RESNET, "ResNet-50 (batch size 32 )", None, "A3C", "a3c")}
    assert len(keys) == 5
    assert all(k.replace("-", "").isalnum() for k in keys)


def suspended(
    job_id: str, duration_s: float, *, in_place: bool = False, checkpoint_bytes: int | None = None
) -> JobSuspended:
    return JobSuspended(
        user="alice",
        job_id=job_id,
        node_id="k80-0",
        attempt=1,
        reason=SuspendReason.TIME_SLICE,
        duration_s=duration_s,
        in_place=in_place,
        checkpoint_bytes=checkpoint_bytes,
    )


def resumed_in_place(job_id: str, duration_s: float) -> JobResumed:
    return JobResumed(
        user="alice",
        job_id=job_id,
        node_id="k80-0",
        gpu_indices=(0,),
        attempt=1,
        duration_s=duration_s,
        in_place=True,
    )


async def switches_folded(harness: Harness, job_id: str, reports: int) -> JobProfileRecord:
    """Until the job's record counts `reports` switch reports folded in, and what they
    published is out."""
    kv = await harness.bus.key_value(PROFILES.name)
    found: list[JobProfileRecord] = []

    async def folded() -> bool:
        entry = await kv.get(job_profile_key("alice", job_id))
        if entry is None:
            return False
        found[:] = [JobProfileRecord.model_validate_json(entry.value)]
        return found[0].switches.reports >= reports

    await eventually(folded)
    await eventually(lambda: harness.bus.backlog() == 0)
    return found[0]


async def test_switch_reports_become_the_jobs_estimates_once_each(harness: Harness) -> None:
    await harness.publish(
        registered("k80-0", "k80"),
        accepted("j1"),
        progress("j1", "k80", 2.0, 100, first_step_s=12.0),  # a cold start
        suspended("j1", 0.8, checkpoint_bytes=2_000_000_000),
        resumed_in_place("j1", 0.2),
        suspended("j1", 0.7, in_place=True),  # median 0.75: too close to 0.8 to publish
    )
    await switches_folded(harness, "j1", 4)
    # A stall: one slow yield moves the median by one place, not by its 30 s.
    stall = Envelope.wrap(suspended("j1", 30.0), source="node")
    await harness.tool.publish_envelope(stall)
    record = await switches_folded(harness, "j1", 5)
    assert record.switches.yields == (0.8, 0.7, 30.0)
    published = await harness.costs()
    assert published[-1] == SwitchCostsUpdated(
        user="alice",
        job_id="j1",
        reports=3,  # neither the close yield nor the stall moved an estimate enough
        yield_s=0.8,
        resume_in_place_s=0.2,
        cold_start_s=12.0,
        checkpoint_bytes=2_000_000_000,
    )
    count = len(published)

    # The stall's report delivered again, after a restart too, is not counted again: counted
    # twice, the median yield would be 15.4 s.
    await harness.stop()
    await harness.start()
    await harness.bus.publish(
        stall.subject, stall.model_dump_json().encode(), msg_id=f"{stall.id}-resent"
    )
    # A new process's first report whose steps lie before the last report folded (a forced
    # yield lost them) still measures its cold start.
    await harness.publish(progress("j1", "k80", 2.0, 90, first_step_s=14.0))
    record = await switches_folded(harness, "j1", 6)
    assert record.switches.yields == (0.8, 0.7, 30.0)
    assert record.switches.cold_starts == (12.0, 14.0)
    assert record.last_iterations == 100  # its rate stays unfolded: it is stale
    published = await harness.costs()
    assert len(published) == count + 1
    assert published[-1].cold_start_s == pytest.approx(13.0)
    assert published[-1].yield_s == pytest.approx(0.8)
    assert record.switches.published is not None
    assert record.switches.published.cold_start_s == pytest.approx(13.0)


async def test_switch_estimates_are_republished_only_when_they_move(harness: Harness) -> None:
    await harness.publish(
        registered("k80-0", "k80"),
        accepted("j1"),
        suspended("j1", 10.0),
    )
    await switches_folded(harness, "j1", 1)
    assert [c.yield_s for c in await harness.costs()] == [10.0]
    await harness.publish(suspended("j1", 10.2))  # median 10.1: within 5%
    await switches_folded(harness, "j1", 2)
    assert len(await harness.costs()) == 1
    await harness.publish(suspended("j1", 14.0), suspended("j1", 14.0))  # median 12.1
    await switches_folded(harness, "j1", 4)
    assert [c.yield_s for c in await harness.costs()] == [10.0, pytest.approx(12.1)]
    # A report that measured nothing (no duration) is no switch report.
    await harness.publish(
        JobSuspended(
            user="alice", job_id="j1", node_id="k80-0", attempt=1, reason=SuspendReason.MIGRATION
        )
    )
    await harness.publish(suspended("j1", 14.0))
    record = await switches_folded(harness, "j1", 5)
    assert record.switches.reports == 5


def test_the_book_folds_a_switch_report_once_whichever_way_it_comes_again() -> None:
    book = ProfileBook({})
    now = datetime(2026, 1, 1, tzinfo=UTC)
    book.admit("alice", "j1", None, 1, now)
    first = book.switched(suspended("j1", 1.0), "e1", now)
    assert first is not None and first.costs is not None and first.costs.yield_s == 1.0
    assert book.switched(suspended("j1", 1.0), "e1", now) is None
    replayed = book.replay("alice", "j1", "e1")
    assert replayed is not None and replayed.costs == first.costs  # published again, same id
    job = book.job("alice", "j1")
    assert job is not None and job.switches.yields == (1.0,)
