"""Each user's decayed usage, for the shares tree's decayed mode (docs/design.md §1.1).

The source is split-stride's record (`gfair_stride`): the GPU-seconds each user's jobs held,
per pool, since ``usage_since``, charged at every quantum's tick (``last_tick_at``) from what
the nodes confirmed they held (overruns included). The auction reads it about twice a quantum
and charges the difference since its last reading into the core's `DecayedUsage`, as if held
evenly over the ticks between: one key read, no extra consumer, and the same GPU-seconds
`gfair users` shows. A first reading, or one of a new record (another ``epoch``), charges
everything since ``usage_since`` that way.

`UsageMeter` keeps the last reading and the decayed usage as of it; `UsageReading` is what the
auction stores under ``usage`` in `gfair_shares`, so that the usage survives its restart.
"""

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from gfair.core.usage_decay import DecayedUsage
from gfair.events.fields import UserName
from gfair.state.stride_record import StrideRecord

USAGE_KEY = "usage"


class UsageReading(BaseModel):
    """The auction's last reading of split-stride's usage, and the decayed usage as of it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    epoch: str = Field(description="The split-stride record the totals were read from")
    at: AwareDatetime = Field(description="Its last tick: the totals count up to it")
    totals: dict[UserName, float] = Field(description="GPU-seconds per user since usage_since")
    decayed: dict[UserName, float] = Field(description="Decayed GPU-seconds per user as of `at`")


class UsageMeter:
    def __init__(self, last: UsageReading | None = None) -> None:
        self.last = last

    def usage(self) -> dict[str, float]:
        """User -> decayed GPU-seconds as of the last reading."""
        return dict(self.last.decayed) if self.last is not None else {}

    def read(self, stride: StrideRecord, half_life_s: float) -> bool:
        """Charge what split-stride's record counts since the last reading; whether it did."""
        tick = stride.last_tick_at
        if tick is None:
            return False
        last = self.last
        if last is not None and last.epoch == stride.epoch:
            since, before = last.at, last.totals
        else:
            since, before = stride.usage_since, {}
        if tick <= since:
            return False
        decayed = DecayedUsage(
            half_life_s,
            (last.at if last is not None else since).timestamp(),
            last.decayed if last is not None else None,
        )
        decayed.advance(tick.timestamp())
        totals = {user: sum(pools.values()) for user, pools in stride.usage.items()}
        elapsed = (tick - since).total_seconds()
        for user, total in totals.items():
            # What it held between the readings (a total never falls within one record).
            decayed.charge(user, (total - before.get(user, 0.0)) / elapsed, elapsed)
        self.last = UsageReading(
            epoch=stride.epoch, at=tick, totals=totals, decayed=decayed.usage()
        )
        return True
