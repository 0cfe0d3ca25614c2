"""The trading auction service: who is entitled to how much of every pool, and the trades.

Consumers:
- ``trading-auction-jobs`` (GFAIR_JOBS): accepted (a user's demand grows), completed / failed /
  cancelled (it shrinks);
- ``trading-auction-nodes`` (GFAIR_NODES): registered, failed, recovered, quarantined and
  uncordoned (the pools' capacities);
- ``trading-auction-profiles`` (GFAIR_SCHED): users' profiles from the profiler (their bids);
- ``trading-auction-shares`` (GFAIR_SCHED): an operator's new shares file (`SharesChanged`),
  taken for the next allocation and kept in `gfair_shares` (key ``tree``), so that it stays in
  force over restarts, over the file the service was started with (`GFAIR_SHARES_FILE`).

In the shares file's decayed mode the auction also reads split-stride's record (`gfair_stride`)
twice a quantum for the GPU-seconds each user held (`usage`), keeps each user's decayed usage
in `gfair_shares` (key ``usage``, so that it survives a restart) and recomputes after every
reading that saw a new tick: the weights move with usage at least once a quantum.

Handlers only record inputs (in memory and in `gfair_shares`, so a restart resumes; written behind,
awaited once per batch before it is acknowledged) and mark the market changed; each is idempotent
because inputs are set-like (a job is active or not, a node has one newest state, a profile
replaces the older one). A timer then recomputes, at most once per `recompute_interval_s`, and only
when an input changed: a burst of a hundred submissions costs one auction, not a hundred. A new
allocation is written first (`SharesRecord`, the next revision), then announced
(`EntitlementsUpdated`, and `TradeCleared` for each new trade) under ids derived from the revision;
until the announcement succeeds it is retried every tick, and a restarted auction announces the
allocation in force again (JetStream drops the repeats within its duplicate window; consumers
ignore revisions they have seen).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import structlog
from opentelemetry import trace
from pydantic import BaseModel

from gfair.bus.key_value import KeyValue
from gfair.bus.metrics import export_from_zero, gfair_metrics
from gfair.bus.publisher import EventPublisher, derived_event_id
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.service import Emit, Service
from gfair.bus.write_behind import WriteBehind
from gfair.core.shares_file import SharesFileError, parse_shares
from gfair.core.trading import bid
from gfair.events.envelope import Clock, Envelope, EventData, utc_now
from gfair.events.jobs import JobAccepted, JobCancelled, JobCompleted, JobFailed
from gfair.events.nodes import (
    NodeFailed,
    NodeQuarantined,
    NodeRecovered,
    NodeRegistered,
    NodeUncordoned,
)
from gfair.events.scheduling import (
    EntitlementsUpdated,
    ProfileUpdated,
    SharesChanged,
    TradeCleared,
)
from gfair.state.buckets import SHARES, STRIDE
from gfair.state.share_record import SHARES_KEY, SharesRecord, TradeRecord
from gfair.state.stride_record import load_stride
from gfair_services.profiler.seed import seed_table
from gfair_services.skeleton import Consumes, Every, declare, started
from gfair_services.trading_auction.market import (
    MAX_BID,
    ActiveJob,
    Allocation,
    Market,
    PoolNode,
    SpeedProfile,
)
from gfair_services.trading_auction.settings import TradingAuctionSettings
from gfair_services.trading_auction.usage import USAGE_KEY, UsageMeter, UsageReading

SERVICE_NAME = "trading-auction"

_log = structlog.get_logger("gfair.services.trading_auction")
_tracer = trace.get_tracer("gfair.services.trading_auction")

JobEventData = JobAccepted | JobCompleted | JobFailed | JobCancelled
NodeEventData = NodeRegistered | NodeFailed | NodeRecovered | NodeQuarantined | NodeUncordoned
# Trades that differ by less than this (GPUs, price) are the same trade still in force.
_SAME_TRADE = 1e-6
# The key of the shares file an operator put in force (`TreeInForce`).
TREE_KEY = "tree"
_NEVER = datetime.min.replace(tzinfo=UTC)


class TreeInForce(BaseModel):
    """The last shares file an operator put in force, and by whom (`SharesChanged`)."""

    shares: str
    operator: str
    reason: str | None = None
    changed_at: datetime


def _encode(record: BaseModel) -> bytes:
    return record.model_dump_json().encode()


def announcements(record: SharesRecord) -> list[EventData]:
    """The events that announce an allocation: entitlements, then each newly cleared trade."""
    events: list[EventData] = [
        EntitlementsUpdated(
            revision=record.revision,
            entitlements={
                user: {g: share.entitled for g, share in entry.pools.items()}
                for user, entry in record.users.items()
            },
        )
    ]
    for index in record.cleared:
        cleared = record.trades[index]
        bids: dict[str, float] = {}
        for user, entry in record.users.items():
            value = bid(entry.speeds, cleared.slow_pool, cleared.fast_pool)
            if value is not None and value > 0:
                bids[user] = min(value, MAX_BID)
        # The bids the auction actually ranked (before speeds were rounded for the record).
        bids[cleared.buyer] = cleared.buyer_bid
        bids[cleared.seller] = cleared.seller_bid
        events.append(
            TradeCleared(
                buyer=cleared.buyer,
                seller=cleared.seller,
                fast_pool=cleared.fast_pool,
                slow_pool=cleared.slow_pool,
                quantity=cleared.quantity,
                price=cleared.price,
                bids=bids,
            )
        )
    return events


def _same_trade(a: TradeRecord, b: TradeRecord) -> bool:
    return (
        (a.buyer, a.seller, a.fast_pool, a.slow_pool)
        == (b.buyer, b.seller, b.fast_pool, b.slow_pool)
        and abs(a.quantity - b.quantity) < _SAME_TRADE
        and abs(a.price - b.price) < _SAME_TRADE
    )


class Auction:
    def __init__(
        self,
        market: Market,
        clock: Clock = utc_now,
        shares_text: str = "",
        usage_interval_s: float = 30.0,
    ) -> None:
        self.market = market
        self.clock = clock
        # The decayed mode's usage, read from split-stride's record every `usage_interval_s`.
        self.meter = UsageMeter()
        self.usage_interval_s = usage_interval_s
        self._usage_read_at: datetime | None = None
        self._stride_kv: KeyValue | None = None
        # The shares file in force: the service's own (its settings') until an operator's.
        self.tree = TreeInForce(shares=shares_text, operator="", changed_at=_NEVER)
        self.current: SharesRecord | None = None
        # An allocation written but not (known to be) announced yet.
        self.pending: SharesRecord | None = None
        self.dirty = False
        self._kv: KeyValue | None = None
        self._publisher: EventPublisher | None = None
        # Inputs are written behind: awaited when their batch settles.
        self.writes = WriteBehind()

    @property
    def kv(self) -> KeyValue:
        return started(self._kv, "the trading auction (its bucket)")

    async def start(self, runtime: ServiceRuntime) -> None:
        """Restore inputs and the allocation in force from the bucket (docs/design.md §3.3)."""
        self._kv = await runtime.key_value(SHARES.name)
        self._stride_kv = await runtime.key_value(STRIDE.name)
        self._publisher = runtime.publisher
        jobs: list[ActiveJob] = []
        nodes: list[PoolNode] = []
        profiles: list[SpeedProfile] = []
        for key in await self.kv.keys():
            entry = await self.kv.get(key)
            if entry is None:
                continue
            if key == SHARES_KEY:
                self.current = SharesRecord.model_validate_json(entry.value)
            elif key.startswith("job."):
                jobs.append(ActiveJob.model_validate_json(entry.value))
            elif key.startswith("node."):
                nodes.append(PoolNode.model_validate_json(entry.value))
            elif key.startswith("profile."):
                profiles.append(SpeedProfile.model_validate_json(entry.value))
            elif key == TREE_KEY:
                self._take_tree(TreeInForce.model_validate_json(entry.value))
            elif key == USAGE_KEY:
                self.meter = UsageMeter(UsageReading.model_validate_json(entry.value))
        self.market.restore(jobs, nodes, profiles)
        # Announce what is in force again (it may not have gone out before a crash), and check
        # whether inputs recorded after the last allocation change it.
        self.pending = self.current
        self.dirty = True
        _log.info(
            "market restored",
            revision=self.current.revision if self.current else None,
            jobs=len(jobs),
            nodes=len(nodes),
            profiles=len(profiles),
        )

    # -- inputs ---------------------------------------------------------------------------

    async def on_job_event(self, envelope: Envelope, data: JobEventData) -> Sequence[Emit]:
        if isinstance(data, JobAccepted):
            job = ActiveJob(
                user=data.user,
                job_id=data.job_id,
                gpus=data.gpus,
                job_type=data.job_type,
                array=data.array,
            )
            if self.market.add_job(job):
                self.writes.put(self.kv, job.key, _encode(job))
                self.dirty = True
            return []
        removed = self.market.remove_job(data.user, data.job_id)
        if removed is not None:
            self.writes.delete(self.kv, removed.key)
            self.dirty = True
        return []

    async def on_node_event(self, envelope: Envelope, data: NodeEventData) -> Sequence[Emit]:
        old = self.market.node(data.node_id)
        if isinstance(data, NodeRegistered):
            gpus: dict[str, int] = {}
            for gpu in data.gpus:
                gpus[gpu.generation] = gpus.get(gpu.generation, 0) + 1
            node = PoolNode(
                node_id=data.node_id,
                gpus=gpus,
                quarantined=old.quarantined if old is not None else False,
                as_of=envelope.time,
            )
        elif old is None:
            return []  # no inventory known: it never registered as far as the auction knows
        elif isinstance(data, NodeFailed):
            node = old.model_copy(update={"failed": True, "as_of": envelope.time})
        elif isinstance(data, NodeRecovered):
            node = old.model_copy(update={"failed": False, "as_of": envelope.time})
        elif isinstance(data, NodeQuarantined):
            node = old.model_copy(update={"quarantined": True, "as_of": envelope.time})
        else:
            node = old.model_copy(update={"quarantined": False, "as_of": envelope.time})
        if node == old or (old is not None and node.as_of < old.as_of):
            return []
        changed = self.market.set_node(node)
        self.writes.put(self.kv, node.key, _encode(node))
        self.dirty |= changed
        return []

    async def on_profile(self, envelope: Envelope, data: ProfileUpdated) -> Sequence[Emit]:
        if data.job_id is not None:
            return []  # a single job's profile; users bid with their user profiles
        profile = SpeedProfile(
            user=data.user, job_type=data.job_type, rates=dict(data.rates), as_of=envelope.time
        )
        if self.market.set_profile(profile):
            self.writes.put(self.kv, profile.key, _encode(profile))
            self.dirty = True
        return []

    async def on_shares(self, envelope: Envelope, data: SharesChanged) -> Sequence[Emit]:
        """An operator's new shares file: in force from the next allocation on."""
        if self.tree.operator and envelope.time <= self.tree.changed_at:
            return []  # a redelivery, or a change older than the one in force
        tree = TreeInForce(
            shares=data.shares,
            operator=data.operator,
            reason=data.reason,
            changed_at=envelope.time,
        )
        if self._take_tree(tree):
            self.writes.put(self.kv, TREE_KEY, _encode(tree))
            self.dirty = True
            _log.info("shares changed", operator=data.operator, changes=list(data.changes))
        return []

    def _take_tree(self, tree: TreeInForce) -> bool:
        try:
            parsed = parse_shares(tree.shares, f"shares changed by {tree.operator}")
        except SharesFileError as error:
            # The operator's tool checks the file before it publishes: this one did not.
            _log.error("shares change refused", operator=tree.operator, error=str(error))
            return False
        self.market.set_tree(None if parsed.plain else parsed)
        self.tree = tree
        return True

    # -- the auction ----------------------------------------------------------------------

    async def tick(self) -> Sequence[Emit]:
        if self.pending is not None:
            await self._announce(self.pending)
        await self.read_usage()
        if self.dirty:
            self.dirty = False
            try:
                await self.recompute(self.clock())
            except BaseException:
                self.dirty = True
                raise
        return []

    async def read_usage(self) -> None:
        """In the decayed mode, every `usage_interval_s`: charge what split-stride's record
        counts since the last reading, keep it, and recompute when it saw a new tick."""
        tree = self.market.tree
        if tree is None or not tree.decayed or tree.half_life_s is None:
            return
        now = self.clock()
        last = self._usage_read_at
        if last is not None and (now - last).total_seconds() < self.usage_interval_s:
            return
        if self._stride_kv is None:
            raise RuntimeError("the trading auction has not started: no split-stride bucket")
        self._usage_read_at = now
        stored = await load_stride(self._stride_kv, parts=False)  # its usage only
        if stored is None or not self.meter.read(stored.record, tree.half_life_s):
            return
        assert self.meter.last is not None  # read() just took one
        await self.kv.put(USAGE_KEY, _encode(self.meter.last))
        self.dirty = True

    async def recompute(self, now: datetime) -> SharesRecord | None:
        """Run the auction; write and announce the allocation if it differs from the last."""
        with _tracer.start_as_current_span("trading.allocate") as span:
            allocation = self.market.allocate(self.meter.usage())
            span.set_attribute("gfair.users", len(allocation.users))
            span.set_attribute("gfair.pools", ",".join(allocation.capacity))
            span.set_attribute("gfair.trades", len(allocation.trades))
        # Every pair of the pools known now can trade, so its count starts at 0.
        export_from_zero(
            gfair_metrics().trades,
            (
                {"fast_pool": fast, "slow_pool": slow}
                for fast in allocation.capacity
                for slow in allocation.capacity
                if fast != slow
            ),
        )
        if self._same_as_current(allocation):
            return None
        previous = self.current.trades if self.current is not None else ()
        record = SharesRecord(
            revision=(self.current.revision if self.current is not None else 0) + 1,
            computed_at=now,
            trading=self.market.trading,
            min_seller_gain=self.market.min_seller_gain,
            capacity=allocation.capacity,
            users=allocation.users,
            trades=allocation.trades,
            accounts=allocation.accounts,
            members=dict(self.market.tree.members) if self.market.tree is not None else {},
            shares=self.tree.shares,
            shares_changed_by=self.tree.operator or None,
            shares_changed_at=self.tree.changed_at if self.tree.operator else None,
            cleared=tuple(
                i
                for i, t in enumerate(allocation.trades)
                if not any(_same_trade(t, p) for p in previous)
            ),
        )
        await self.kv.put(SHARES_KEY, _encode(record))
        self.current = self.pending = record
        _log.info(
            "allocation changed",
            revision=record.revision,
            capacity=record.capacity,
            entitlements={
                u: {g: round(s.entitled, 3) for g, s in e.pools.items()}
                for u, e in record.users.items()
            },
            trades=len(record.trades),
            cleared=len(record.cleared),
        )
        await self._announce(record)
        return record

    def _same_as_current(self, allocation: Allocation) -> bool:
        current = self.current
        if current is None:
            return not (allocation.capacity or allocation.users)
        return (
            current.capacity,
            current.users,
            current.trades,
            current.accounts,
            current.shares,
        ) == (
            allocation.capacity,
            allocation.users,
            allocation.trades,
            allocation.accounts,
            self.tree.shares,
        )

    async def _announce(self, record: SharesRecord) -> None:
        if self._publisher is None:
            raise RuntimeError("the trading auction has not started: it cannot publish")
        cause = f"{SHARES.name}/{record.revision}/{record.computed_at.isoformat()}"
        for index, event in enumerate(announcements(record)):
            subject = event.subject()
            await self._publisher.publish(
                event,
                event_id=derived_event_id(cause, index, event.EVENT_TYPE, subject),
                correlation_id=cause,
            )
            if isinstance(event, TradeCleared):
                gfair_metrics().trades.add(
                    1, {"fast_pool": event.fast_pool, "slow_pool": event.slow_pool}
                )
        if self.pending is record:
            self.pending = None


def build_service(
    settings: TradingAuctionSettings | None = None, clock: Clock = utc_now
) -> Service:
    settings = settings or TradingAuctionSettings()
    market = Market(
        seed_table(settings.throughputs),
        settings.flat_tickets_of,
        trading=settings.trading,
        min_seller_gain=settings.min_seller_gain,
        tree=settings.shares,
    )
    auction = Auction(market, clock, settings.shares_text, settings.quantum_s / 2)
    inputs = (
        ("jobs", auction.on_job_event),
        ("nodes", auction.on_node_event),
        ("profiles", auction.on_profile),
        ("shares", auction.on_shares),
    )
    return declare(
        SERVICE_NAME,
        settings,
        start=auction.start,
        consumes=[Consumes(name, h, settle=auction.writes.settle) for name, h in inputs],
        timers=(Every("auction", settings.recompute_interval_s, auction.tick),),
    )
