"""The trading auction on the in-memory bus: demand, capacity and profiles in, shares out."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.runner import RunnerSettings
from gfair.client import GfairClient
from gfair.client.errors import ClientError
from gfair.client.state_access import DirectAccess
from gfair.core.shares_file import parse_shares, with_tickets
from gfair.core.shares_tree import ShareTree
from gfair.core.usage_decay import DecayedUsage
from gfair.events.envelope import Envelope, EventData
from gfair.events.job_array import ArrayMembership
from gfair.events.jobs import JobAccepted, JobCompleted, JobLaunch
from gfair.events.nodes import NodeFailed, NodeRecovered
from gfair.events.scheduling import (
    EntitlementsUpdated,
    ProfileUpdated,
    SharesChanged,
    TradeCleared,
)
from gfair.state.buckets import SHARES, STRIDE
from gfair.state.share_record import SHARES_KEY, SharesRecord
from gfair.state.stride_record import STATE_KEY, StrideRecord
from gfair_services.topology import cluster_topology
from gfair_services.trading_auction import Settings, build_service
from gfair_services.trading_auction.market import ActiveJob, Market, PoolNode
from gfair_services.trading_auction.service import Auction
from gfair_services.trading_auction.usage import USAGE_KEY, UsageMeter, UsageReading
from support.waiting import consistently, eventually

from .scheduling_harness import ServiceHarness, registered

FAST = RunnerSettings(batch=10, fetch_timeout_s=0.02, error_pause_s=0.02)
# Job types by how much they gain from a V100 over a K80.
SEED = {
    "six-x": {"k80": 1.0, "v100": 6.0},
    "two-x": {"k80": 1.0, "v100": 2.0},
    "one-point-two-x": {"k80": 1.0, "v100": 1.2},
}


def jobs(user: str, job_type: str, count: int, *, start: int = 0) -> list[JobAccepted]:
    return [
        JobAccepted(
            user=user,
            job_id=f"j{i}",
            gpus=1,
            job_type=job_type,
            launch=JobLaunch(command=("true",)),
        )
        for i in range(start, start + count)
    ]


# What `registered("k80-0", "k80"), registered("v100-0", "v100")` offer.
TWO_POOLS = {"k80": 4, "v100": 4}


class Harness(ServiceHarness):
    def __init__(self, bus: InMemoryBus, settings: Settings) -> None:
        super().__init__(bus, lambda: build_service(settings), FAST)
        self.settings = settings

    async def shares(self) -> SharesRecord | None:
        entry = await (await self.bus.key_value(SHARES.name)).get(SHARES_KEY)
        return None if entry is None else SharesRecord.model_validate_json(entry.value)

    async def settle(self, check: Callable[[SharesRecord], bool]) -> SharesRecord:
        """Until the allocation in force satisfies `check`; returns it."""
        found: list[SharesRecord] = []

        async def holds() -> bool:
            record = await self.shares()
            if record is None or not check(record):
                return False
            found[:] = [record]
            return True

        await eventually(holds)
        return found[0]

    async def sched_events(self) -> list[EventData]:
        out: list[EventData] = []
        async for message in self.bus.history("GFAIR_SCHED"):
            envelope = Envelope.model_validate_json(message.data)
            if envelope.type == EntitlementsUpdated.EVENT_TYPE:
                out.append(EntitlementsUpdated.model_validate(envelope.data))
            elif envelope.type == TradeCleared.EVENT_TYPE:
                out.append(TradeCleared.model_validate(envelope.data))
        return out


@pytest.fixture
def seed_file(tmp_path: Path) -> Path:
    path = tmp_path / "throughputs.json"
    path.write_text(
        json.dumps(
            {
                generation: {
                    f"('{job_type}', 1)": {"null": rates[generation]}
                    for job_type, rates in SEED.items()
                }
                for generation in ("k80", "v100")
            }
        )
    )
    return path


@pytest.fixture
async def harness(seed_file: Path) -> AsyncIterator[Harness]:
    bus = InMemoryBus()
    found = Harness(bus, Settings(throughputs=seed_file, recompute_interval_s=0.03))
    await found.start()
    try:
        yield found
    finally:
        if found.runtime is not None and not found.runtime.stopping:
            await found.stop()
        await bus.close()


def taken_in(record: SharesRecord, capacity: dict[str, int], **jobs: int) -> bool:
    """Whether `record` was computed from every node and job sent; earlier ones are partial."""
    in_record = {user: share.jobs for user, share in record.users.items()}
    return record.capacity == capacity and in_record == jobs


def by_user(record: SharesRecord, user: str, pool: str) -> tuple[float, float]:
    share = record.users[user].pools[pool]
    return share.fair, share.entitled


def heard(record: SharesRecord, **jobs_of: int) -> bool:
    """Exactly these users, each with this many jobs counted: an earlier revision may have
    heard only some of the jobs published at once, and shared the GPUs by those."""
    return set(record.users) == set(jobs_of) and all(
        record.users[user].jobs == count for user, count in jobs_of.items()
    )


def all_heard(record: SharesRecord) -> bool:
    """Both users' eight jobs counted."""
    return len(record.users) == 2 and all(user.jobs == 8 for user in record.users.values())


async def same_shares(harness: Harness, record: SharesRecord) -> bool:
    return await harness.shares() == record


async def test_fast_gpu_share_goes_to_the_user_who_gains_most(harness: Harness) -> None:
    await harness.publish(registered("k80-0", "k80"), registered("v100-0", "v100"))
    await harness.publish(*jobs("u6", "six-x", 8), *jobs("u12", "one-point-two-x", 8))
    record = await harness.settle(lambda r: taken_in(r, TWO_POOLS, u6=8, u12=8))

    # Without trading each holds half of each pool (4 of the 8 GPUs its jobs ask); the 6x user
    # buys V100 share with K80 share, which the 1.2x user has jobs enough to use.
    assert by_user(record, "u6", "v100")[0] == pytest.approx(2.0)
    assert by_user(record, "u6", "v100")[1] > 3.0
    assert by_user(record, "u6", "k80")[1] < 1.0
    assert by_user(record, "u12", "v100")[1] < 1.0
    assert by_user(record, "u12", "k80")[1] > 3.0
    (trade,) = record.trades
    assert (trade.buyer, trade.seller, trade.fast_pool, trade.slow_pool) == (
        "u6",
        "u12",
        "v100",
        "k80",
    )
    # Two bidders: the second price is the seller's own bid, raised by the 10% seller gain.
    assert trade.price == pytest.approx(1.2 * 1.1)
    for user in record.users.values():
        assert user.throughput_entitled >= user.throughput_fair - 1e-9
    assert record.users["u6"].gain > 0.3

    events = await harness.sched_events()
    updates = [e for e in events if isinstance(e, EntitlementsUpdated)]
    assert updates[-1].revision == record.revision
    assert updates[-1].entitlements["u6"]["v100"] == pytest.approx(by_user(record, "u6", "v100")[1])
    cleared = [e for e in events if isinstance(e, TradeCleared)]
    assert cleared and (cleared[-1].buyer, cleared[-1].seller) == ("u6", "u12")
    assert cleared[-1].bids["u6"] == pytest.approx(6.0)
    assert cleared[-1].bids["u12"] == pytest.approx(1.2)


async def test_the_price_is_the_second_highest_bid(harness: Harness) -> None:
    await harness.publish(registered("k80-0", "k80"), registered("v100-0", "v100", gpus=8))
    await harness.publish(registered("k80-1", "k80", gpus=8))
    await harness.publish(
        *jobs("u6", "six-x", 8), *jobs("u2", "two-x", 8), *jobs("u12", "one-point-two-x", 8)
    )
    capacity = {"k80": 12, "v100": 8}
    record = await harness.settle(lambda r: taken_in(r, capacity, u6=8, u2=8, u12=8))
    first = record.trades[0]
    assert (first.buyer, first.seller) == ("u6", "u12")
    assert first.price == pytest.approx(2.0)
    for user in record.users.values():
        assert user.throughput_entitled >= user.throughput_fair - 1e-9


async def test_recomputes_only_when_inputs_change(harness: Harness) -> None:
    await harness.publish(registered("k80-0", "k80"), registered("v100-0", "v100"))
    await harness.publish(*jobs("u6", "six-x", 8), *jobs("u12", "one-point-two-x", 8))
    record = await harness.settle(lambda r: taken_in(r, TWO_POOLS, u6=8, u12=8))
    revision = record.revision
    # Redelivered acceptances, a registration repeated, a profile that says what the seed said.
    await harness.publish(*jobs("u6", "six-x", 2), registered("k80-0", "k80"))
    await harness.publish(
        ProfileUpdated(
            user="u12",
            job_type="one-point-two-x",
            rates={"k80": 1.0, "v100": 1.2},
            baseline="k80",
        )
    )
    await harness.publish(*jobs("late", "two-x", 1))  # a real change, after the others
    later = await harness.settle(lambda r: "late" in r.users)
    assert later.revision == revision + 1
    updates = [e for e in await harness.sched_events() if isinstance(e, EntitlementsUpdated)]
    assert [u.revision for u in updates] == list(range(1, later.revision + 1))


async def test_profiles_change_the_bids(harness: Harness) -> None:
    await harness.publish(registered("k80-0", "k80"), registered("v100-0", "v100"))
    await harness.publish(*jobs("u6", "six-x", 8), *jobs("u12", "one-point-two-x", 8))
    await harness.settle(lambda r: bool(r.trades) and r.trades[0].buyer == "u6")
    # The profiler measured u12's jobs: they gain 10x from a V100, more than u6's.
    await harness.publish(
        ProfileUpdated(
            user="u12",
            job_type="one-point-two-x",
            rates={"k80": 1.0, "v100": 10.0},
            baseline="k80",
            observed=("k80", "v100"),
        )
    )
    record = await harness.settle(lambda r: bool(r.trades) and r.trades[0].buyer == "u12")
    assert record.trades[0].seller == "u6"
    assert record.users["u12"].speeds["k80"] == pytest.approx(0.1)


async def test_capacity_follows_node_health_and_demand_follows_jobs(harness: Harness) -> None:
    await harness.publish(registered("k80-0", "k80"), registered("v100-0", "v100"))
    await harness.publish(*jobs("u6", "six-x", 2), *jobs("u2", "two-x", 2))
    await harness.settle(lambda r: r.capacity == {"k80": 4, "v100": 4} and len(r.users) == 2)
    await harness.publish(NodeFailed(node_id="v100-0", reason="missed heartbeats"))
    record = await harness.settle(lambda r: r.capacity == {"k80": 4})
    assert not record.trades  # one pool: nothing to trade
    await harness.publish(NodeRecovered(node_id="v100-0"))
    await harness.settle(lambda r: r.capacity == {"k80": 4, "v100": 4})
    await harness.publish(*(JobCompleted(user="u2", job_id=f"j{i}", attempt=1) for i in range(2)))
    record = await harness.settle(lambda r: set(r.users) == {"u6"})
    # Alone, u6 is entitled to what its 2 jobs ask (water-filling), nothing more.
    assert sum(s.entitled for s in record.users["u6"].pools.values()) == pytest.approx(2.0)


async def test_an_arrays_demand_stops_at_its_limit(harness: Harness) -> None:
    # Six members of an array limited to two, beside one other job: the market water-fills
    # what the array can hold at once (2 GPUs), as the scheduler's drivers do, not all six.
    await harness.publish(registered("k80-0", "k80"), registered("v100-0", "v100"))
    limited = ArrayMembership(id="sweep", index=0, limit=2)
    await harness.publish(
        *(
            JobAccepted(
                user="u6",
                job_id=f"sweep-{i}",
                gpus=1,
                job_type="six-x",
                array=limited.model_copy(update={"index": i}),
                launch=JobLaunch(command=("true",)),
            )
            for i in range(6)
        ),
        *jobs("u2", "two-x", 6),
    )
    record = await harness.settle(lambda r: heard(r, u6=6, u2=6))
    assert record.users["u6"].demand == 2
    assert sum(s.entitled for s in record.users["u6"].pools.values()) == pytest.approx(2.0)
    assert sum(s.entitled for s in record.users["u2"].pools.values()) == pytest.approx(6.0)


async def test_tickets_weigh_the_fair_shares(seed_file: Path) -> None:
    bus = InMemoryBus()
    harness = Harness(
        bus,
        Settings(
            throughputs=seed_file,
            recompute_interval_s=0.03,
            user_tickets="heavy=3",
            trading=False,
        ),
    )
    await harness.start()
    try:
        await harness.publish(registered("k80-0", "k80", gpus=8))
        await harness.publish(*jobs("heavy", "six-x", 8), *jobs("light", "six-x", 8))
        record = await harness.settle(all_heard)
        assert by_user(record, "heavy", "k80") == pytest.approx((6.0, 6.0))
        assert by_user(record, "light", "k80") == pytest.approx((2.0, 2.0))
        assert record.users["heavy"].tickets == 3.0
    finally:
        await harness.stop()
        await bus.close()


async def test_a_shares_file_divides_the_pools_down_its_accounts(
    seed_file: Path, tmp_path: Path
) -> None:
    shares = tmp_path / "shares.toml"
    shares.write_text(
        "[accounts.team]\ntickets = 1\n"
        '[users.a1]\naccount = "team"\n[users.a2]\naccount = "team"\ntickets = 3\n'
    )
    bus = InMemoryBus()
    settings = Settings(
        throughputs=seed_file, recompute_interval_s=0.03, shares_file=shares, trading=False
    )
    harness = Harness(bus, settings)
    await harness.start()
    try:
        await harness.publish(registered("k80-0", "k80", gpus=8))
        await harness.publish(*jobs("a1", "six-x", 8), *jobs("a2", "six-x", 8))
        await harness.publish(*jobs("solo", "six-x", 8))
        record = await harness.settle(lambda r: heard(r, a1=8, a2=8, solo=8))
        # The root: team 1, solo (not in the file) 1 -> 4 and 4; the team: a1 1, a2 3 -> 1, 3.
        assert by_user(record, "solo", "k80") == pytest.approx((4.0, 4.0))
        assert by_user(record, "a1", "k80") == pytest.approx((1.0, 1.0))
        assert by_user(record, "a2", "k80") == pytest.approx((3.0, 3.0))
        assert record.users["a2"].tickets == 3.0
        # The record carries the tree, for `gfair shares show`.
        assert record.members == {"a1": "team", "a2": "team"}
        assert record.accounts["team"].tickets == 1.0
        assert record.accounts["team"].fair == pytest.approx(4.0)
        assert record.accounts["team"].demand == 16.0  # a1's 8 and a2's 8
    finally:
        await harness.stop()
        await bus.close()


async def test_an_operators_change_is_in_force_at_once_and_over_restarts(
    seed_file: Path, tmp_path: Path
) -> None:
    shares = tmp_path / "shares.toml"
    shares.write_text('[accounts.team]\n[users.a1]\naccount = "team"\n')
    bus = InMemoryBus()
    settings = Settings(
        throughputs=seed_file, recompute_interval_s=0.03, shares_file=shares, trading=False
    )
    harness = Harness(bus, settings)
    await harness.start()
    try:
        await harness.publish(registered("k80-0", "k80", gpus=8))
        await harness.publish(*jobs("a1", "six-x", 8), *jobs("solo", "six-x", 8))
        record = await harness.settle(all_heard)
        assert by_user(record, "a1", "k80")[0] == pytest.approx(4.0)
        assert record.shares_changed_by is None and "[accounts.team]" in record.shares

        operator = GfairClient(bus, access=DirectAccess(bus))
        tree = with_tickets(await operator.shares_in_force(), "team", 3.0)
        sent = await operator.change_shares(tree, operator="ops", reason="the team grows")
        assert sent.changes == ("account team: tickets 1 -> 3",)
        changed = await harness.settle(lambda r: r.shares_changed_by == "ops")
        assert by_user(changed, "a1", "k80") == pytest.approx((6.0, 6.0))  # no restart
        assert by_user(changed, "solo", "k80") == pytest.approx((2.0, 2.0))
        assert changed.accounts["team"].tickets == 3.0
        assert changed.revision == record.revision + 1

        tenant = DirectAccess(bus)
        tenant.tenant = "solo"
        with pytest.raises(ClientError, match="operator's command"):
            await GfairClient(bus, access=tenant).change_shares(ShareTree())

        # Restarted with the same file, the auction keeps the operator's change.
        await harness.stop()
        await harness.start()
        await harness.publish(*jobs("solo", "six-x", 1, start=8))
        later = await harness.settle(lambda r: r.users["solo"].jobs == 9)
        assert by_user(later, "a1", "k80") == pytest.approx((6.0, 6.0))
        assert later.shares_changed_by == "ops"
        # The audit trail: who changed what, and why, in the scheduler's stream.
        trail = [
            SharesChanged.model_validate(envelope.data)
            async for message in bus.history("GFAIR_SCHED")
            if (envelope := Envelope.model_validate_json(message.data)).type
            == SharesChanged.EVENT_TYPE
        ]
        assert [(c.operator, c.reason, c.changes) for c in trail] == [
            ("ops", "the team grows", ("account team: tickets 1 -> 3",))
        ]
    finally:
        await harness.stop()
        await bus.close()


async def test_restart_rebuilds_from_the_bucket_and_announces_nothing_twice(
    harness: Harness,
) -> None:
    await harness.publish(registered("k80-0", "k80"), registered("v100-0", "v100"))
    await harness.publish(*jobs("u6", "six-x", 8), *jobs("u12", "one-point-two-x", 8))
    record = await harness.settle(lambda r: taken_in(r, TWO_POOLS, u6=8, u12=8))
    events_before = await harness.sched_events()
    await harness.stop()

    await harness.start()
    # Several ticks: the restored market must agree with the record.
    await consistently(lambda: same_shares(harness, record), 0.2)
    # The allocation in force was announced again under the same ids: the stream kept one copy.
    assert await harness.sched_events() == events_before
    await harness.publish(JobCompleted(user="u12", job_id="j0", attempt=1))
    later = await harness.settle(lambda r: r.users["u12"].jobs == 7)
    assert later.revision == record.revision + 1


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["a", "b", "c", "d"]),
        st.tuples(st.sampled_from(sorted(SEED)), st.integers(1, 12), st.floats(0.5, 4.0)),
        min_size=1,
    ),
    st.integers(1, 16),
    st.integers(1, 16),
)
def test_nobody_ends_below_its_no_trade_throughput(
    users: dict[str, tuple[str, int, float]], k80_gpus: int, v100_gpus: int
) -> None:
    now = datetime.now(UTC)
    market = Market(SEED, lambda user: users[user][2])
    for node_id, generation, gpus in (("k", "k80", k80_gpus), ("v", "v100", v100_gpus)):
        market.set_node(PoolNode(node_id=node_id, gpus={generation: gpus}, as_of=now))
    for user, (job_type, count, _) in users.items():
        for i in range(count):
            market.add_job(ActiveJob(user=user, job_id=f"j{i}", gpus=1, job_type=job_type))
    allocation = market.allocate()
    for share in allocation.users.values():
        assert share.throughput_entitled >= share.throughput_fair - 1e-6
    for pool, gpus in allocation.capacity.items():
        assert sum(s.pools[pool].entitled for s in allocation.users.values()) <= gpus + 1e-6


async def test_a_stale_or_unreadable_shares_change_changes_nothing() -> None:
    market = Market({}, lambda user: 1.0)
    auction = Auction(market)
    bus = InMemoryBus()
    await bus.ensure_topology(cluster_topology())
    auction._kv = await bus.key_value(SHARES.name)
    now = datetime(2026, 11, 26, tzinfo=UTC)

    def change(text: str, at: datetime) -> tuple[Envelope, SharesChanged]:
        data = SharesChanged(operator="ops", shares=text)
        return Envelope.wrap(data, source="test", time=at), data

    await auction.on_shares(*change("[accounts.a]\n[users.u]\naccount = 'a'\n", now))
    assert market.tree is not None and set(market.tree.accounts) == {"a"}
    assert auction.dirty
    auction.dirty = False
    await auction.on_shares(*change("[accounts.old]\n", now - timedelta(seconds=1)))
    await auction.on_shares(*change("[accounts.bad/x]\n", now + timedelta(seconds=1)))
    assert set(market.tree.accounts) == {"a"} and not auction.dirty
    await auction.writes.settle()


# -- the decayed mode ------------------------------------------------------------------------

HOUR = timedelta(hours=1)
T0 = datetime(2026, 11, 26, tzinfo=UTC)


def stride(at: datetime, usage: dict[str, float], epoch: str = "e1") -> StrideRecord:
    """Split-stride's record as of its tick at `at`: GPU-seconds per user since T0."""
    return StrideRecord(
        epoch=epoch,
        usage_since=T0,
        last_tick_at=at,
        updated_at=at,
        usage={user: {"k80": seconds} for user, seconds in usage.items()},
    )


async def split_stride_ticked(bus: InMemoryBus, record: StrideRecord) -> None:
    await (await bus.key_value(STRIDE.name)).put(STATE_KEY, record.to_bytes())


def entitled(record: SharesRecord, user: str) -> float:
    return record.users[user].pools["k80"].entitled


def b_share(usage: dict[str, float]) -> float:
    """b's GPUs of 8 beside a, both backlogged, one ticket each (docs/design.md §1.1)."""
    total = sum(usage.values())
    w_a, w_b = (2 ** (-usage.get(u, 0.0) / total / 0.5) for u in ("a", "b"))
    return 8 * w_b / (w_a + w_b)


async def test_the_decayed_mode_weighs_the_usage_split_stride_counted(
    seed_file: Path, tmp_path: Path
) -> None:
    """a held all 8 GPUs for a half-life, then b comes: b is entitled to 6.4 (weights 1/4
    and 1), and less as its usage catches up, over a restart of the auction too."""
    shares = tmp_path / "shares.toml"
    shares.write_text('fairness = "decayed"\nhalf_life = "1h"\n')
    bus = InMemoryBus()
    settings = Settings(
        throughputs=seed_file,
        recompute_interval_s=0.03,
        quantum_s=0.1,
        shares_file=shares,
        trading=False,
    )
    harness = Harness(bus, settings)
    await harness.start()
    try:
        await harness.publish(registered("k80-0", "k80", gpus=8))
        await harness.publish(*jobs("a", "six-x", 8), *jobs("b", "six-x", 8))
        record = await harness.settle(all_heard)
        assert entitled(record, "b") == pytest.approx(4.0)  # no usage yet: the tickets

        await split_stride_ticked(bus, stride(T0 + HOUR, {"a": 8 * 3600.0}))
        record = await harness.settle(lambda r: entitled(r, "b") > 4.1)
        assert entitled(record, "a") == pytest.approx(1.6)
        assert entitled(record, "b") == pytest.approx(6.4)
        assert record.users["b"].pools["k80"].fair == pytest.approx(6.4)  # before trading

        # Half an hour at those entitlements: b's usage catches up, its lead shrinks.
        expected = DecayedUsage(3600.0, (T0 + HOUR).timestamp())
        expected.charge("a", 8.0, 3600.0)
        at = T0 + 1.5 * HOUR
        totals = {"a": 8 * 3600.0 + 1.6 * 1800, "b": 6.4 * 1800}
        expected.advance(at.timestamp())
        expected.charge("a", 1.6, 1800.0)
        expected.charge("b", 6.4, 1800.0)
        await split_stride_ticked(bus, stride(at, totals))
        record = await harness.settle(lambda r: entitled(r, "b") < 6.3)
        assert entitled(record, "b") == pytest.approx(b_share(expected.usage()))
        assert 4.0 < entitled(record, "b") < 6.4

        # Restarted, the auction keeps its usage (in gfair_shares) and goes on from it: the
        # next tick charges only the half hour since, not everything since T0 again.
        await harness.stop()
        await harness.start()
        # Several readings of the same tick: nothing changes.
        await consistently(lambda: same_shares(harness, record), 0.3)
        at = T0 + 2 * HOUR
        held = entitled(record, "b")
        totals = {"a": totals["a"] + (8 - held) * 1800, "b": totals["b"] + held * 1800}
        expected.advance(at.timestamp())
        expected.charge("a", 8 - held, 1800.0)
        expected.charge("b", held, 1800.0)
        await split_stride_ticked(bus, stride(at, totals))
        later = await harness.settle(lambda r: r.revision > record.revision)
        assert entitled(later, "b") == pytest.approx(b_share(expected.usage()))
        kept = await (await bus.key_value(SHARES.name)).get(USAGE_KEY)
        assert kept is not None
        assert UsageReading.model_validate_json(kept.value).decayed == pytest.approx(
            expected.usage()
        )
    finally:
        await harness.stop()
        await bus.close()


async def test_the_instantaneous_mode_reads_no_usage(harness: Harness) -> None:
    await harness.publish(registered("k80-0", "k80", gpus=8))
    await harness.publish(*jobs("a", "six-x", 8), *jobs("b", "six-x", 8))
    record = await harness.settle(all_heard)
    await split_stride_ticked(harness.bus, stride(T0 + HOUR, {"a": 8 * 3600.0}))
    await consistently(lambda: same_shares(harness, record), 0.2)
    assert await (await harness.bus.key_value(SHARES.name)).get(USAGE_KEY) is None


def test_the_meter_charges_each_tick_once_and_starts_over_with_a_new_record() -> None:
    meter = UsageMeter()
    assert not meter.read(StrideRecord.fresh("e1", T0), 3600.0)  # no tick yet
    assert meter.read(stride(T0 + HOUR, {"a": 8 * 3600.0}), 3600.0)
    alone = 8 * 3600 * 0.5 / math.log(2)  # 8 GPUs for a half-life, weighed by age
    assert meter.usage() == pytest.approx({"a": alone})
    assert not meter.read(stride(T0 + HOUR, {"a": 8 * 3600.0}), 3600.0)  # the same tick
    # A new record (split-stride's bucket made anew) counts from its own start: its totals
    # are not taken as less than the last ones.
    assert meter.read(stride(T0 + 2 * HOUR, {"b": 3600.0}, epoch="e2"), 3600.0)
    assert meter.usage()["a"] == pytest.approx(alone / 2)
    assert meter.usage()["b"] > 0
    # A new half-life applies from the next reading on.
    before = meter.usage()["a"]
    assert meter.read(stride(T0 + 3 * HOUR, {"b": 3600.0}, epoch="e2"), 7200.0)
    assert meter.usage()["a"] == pytest.approx(before * 2**-0.5)


def test_a_decayed_tree_is_kept_even_without_accounts() -> None:
    market = Market({}, lambda user: 1.0)
    auction = Auction(market)
    auction._take_tree(
        auction.tree.model_copy(update={"shares": 'fairness = "decayed"\nhalf_life = "2h"\n'})
    )
    assert market.tree == parse_shares('fairness = "decayed"\nhalf_life = "2h"\n')
    auction._take_tree(auction.tree.model_copy(update={"shares": "[users.u]\ntickets = 1\n"}))
    assert market.tree is not None and not market.tree.decayed
    auction._take_tree(auction.tree.model_copy(update={"shares": ""}))
    assert market.tree is None
