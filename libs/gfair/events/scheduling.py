"""Scheduler-wide events on `gfair.sched.<event>`: the clock, decisions, profiles and shares."""

from __future__ import annotations

from typing import ClassVar, Self

from pydantic import AwareDatetime, Field, model_validator

from gfair.events.envelope import EventData
from gfair.events.fields import (
    Bytes,
    Generation,
    JobId,
    JobRefs,
    Name,
    NodeId,
    PositiveSeconds,
    Rate,
    Ratio,
    Reason,
    Seconds,
    Share,
    UserName,
)
from gfair.events.registry import register
from gfair.events.subjects import sched_subject


class SchedEvent(EventData):
    """Base of the scheduler-wide events; `SCHED_EVENT` is the subject's last token."""

    SCHED_EVENT: ClassVar[str] = ""

    def subject(self) -> str:
        return sched_subject(self.SCHED_EVENT)

    @classmethod
    def subject_pattern(cls) -> str:
        return sched_subject(cls.SCHED_EVENT)


@register
class QuantumTicked(SchedEvent):
    """A new quantum starts: every server's scheduler picks what runs until the next tick."""

    EVENT_TYPE = "gfair.quantum.ticked.v1"
    SCHED_EVENT = "tick"

    quantum: int = Field(ge=0, description="Quantum number, counting from 0")
    starts_at: AwareDatetime
    length_s: PositiveSeconds


@register
class ScheduleDecided(SchedEvent):
    """What runs on one server during one quantum.

    `central` is true when the central stride gave the whole server to a multi-server gang for
    this quantum and the server's local scheduler yielded (docs/design.md §2.3).
    """

    EVENT_TYPE = "gfair.schedule.decided.v1"
    SCHED_EVENT = "decision"

    quantum: int = Field(ge=0)
    server: NodeId
    running: JobRefs = Field(description="Jobs that hold GPUs of this server this quantum")
    central: bool = False


@register
class ProfileUpdated(SchedEvent):
    """Throughput estimates of one job, or of a user when `job_id` is absent (docs/design.md §2.4).

    `speedups[g]` is `rates[g] / rates[baseline]`; `observed` names the generations measured on
    the cluster, the others come from the seed table.
    """

    EVENT_TYPE = "gfair.profile.updated.v1"
    SCHED_EVENT = "profile"

    user: UserName
    job_id: JobId | None = None
    job_type: Name | None = None
    rates: dict[Generation, Rate] = Field(min_length=1, description="Mini-batches per second")
    baseline: Generation
    speedups: dict[Generation, Ratio] = Field(default_factory=dict)
    observed: tuple[Generation, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.baseline not in self.rates:
            raise ValueError(f"baseline {self.baseline!r} has no rate")
        unknown = sorted((set(self.speedups) | set(self.observed)) - set(self.rates))
        if unknown:
            raise ValueError(f"generations without a rate: {', '.join(unknown)}")
        return self


@register
class SwitchCostsUpdated(SchedEvent):
    """What one job's switches take, as the profiler estimates them from its nodes' reports
    (docs/design.md §2.4): each the median of the job's last few, None until one was measured.

    Split-stride charges the job from them (§2.7): a resume its yield and in-place resume (its
    cold start when its process was not parked in place), a move its yield and cold start.
    """

    EVENT_TYPE = "gfair.switch_costs.updated.v1"
    SCHED_EVENT = "switch_costs"

    user: UserName
    job_id: JobId
    reports: int = Field(
        ge=1,
        description="Switch reports folded into these estimates so far: a later estimate of "
        "the job has more",
    )
    yield_s: Seconds | None = Field(
        default=None, description="A suspend: from the command to its GPUs free"
    )
    resume_in_place_s: Seconds | None = Field(
        default=None,
        description="A resume of its process parked in place: from the command to its first "
        "new mini-batch",
    )
    cold_start_s: Seconds | None = Field(
        default=None,
        description="A new process (a start, from its checkpoint or not): from the command to "
        "its first mini-batch",
    )
    checkpoint_bytes: Bytes | None = Field(
        default=None, description="Size of the last checkpoint a suspend wrote"
    )


@register
class EntitlementsUpdated(SchedEvent):
    """Each active user's share of each pool, in GPUs, after water-filling and trading."""

    EVENT_TYPE = "gfair.entitlements.updated.v1"
    SCHED_EVENT = "entitlements"

    revision: int = Field(ge=0, description="Grows with every update; older ones are stale")
    entitlements: dict[UserName, dict[Generation, Share]]


@register
class TradeCleared(SchedEvent):
    """One second-price trade between two pools (docs/design.md §2.5).

    The seller gives `quantity` GPUs of share in `fast_pool` to the buyer and receives
    `quantity * price` GPUs of share in `slow_pool`. `bids` are every bidder's speedup of
    fast over slow; the price, the second-highest bid, lies between the seller's and the
    buyer's bids.
    """

    EVENT_TYPE = "gfair.trade.cleared.v1"
    SCHED_EVENT = "trade"

    buyer: UserName
    seller: UserName
    fast_pool: Generation
    slow_pool: Generation
    quantity: Share = Field(gt=0, description="GPUs of fast-pool share moved")
    price: Ratio = Field(description="Slow-pool GPUs paid per fast-pool GPU")
    bids: dict[UserName, Ratio]

    @model_validator(mode="after")
    def _is_a_trade(self) -> Self:
        if self.buyer == self.seller:
            raise ValueError("buyer and seller must differ")
        if self.fast_pool == self.slow_pool:
            raise ValueError("fast_pool and slow_pool must differ")
        missing = sorted({self.buyer, self.seller} - set(self.bids))
        if missing:
            raise ValueError(f"no bid from {', '.join(missing)}")
        if not self.bids[self.seller] <= self.price <= self.bids[self.buyer]:
            raise ValueError(
                f"price {self.price} must lie between the seller's bid "
                f"{self.bids[self.seller]} and the buyer's bid {self.bids[self.buyer]}"
            )
        return self


# A shares file of thousands of accounts and users fits; the broker's message limit is 1 MiB.
MAX_SHARES_CHARS = 512 * 1024


@register
class SharesChanged(SchedEvent):
    """An operator put a new shares file in force (docs/design.md §1.1): the whole file, and
    what changed from the one before. The trading auction takes it for its next allocation and
    keeps it over restarts; the event is the audit trail of who changed what."""

    EVENT_TYPE = "gfair.shares.changed.v1"
    SCHED_EVENT = "shares"

    operator: Name
    reason: Reason | None = None
    shares: str = Field(
        max_length=MAX_SHARES_CHARS, description="The shares file (TOML) now in force"
    )
    changes: tuple[Name, ...] = Field(
        default=(), description="What differs from the file in force before, one line each"
    )
