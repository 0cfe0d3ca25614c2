"""What the client's reads return: plain, typed views over records and events."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from gfair.bus.history import HistoricalEvent
from gfair.events.fields import JobRef
from gfair.events.jobs import JobEvent
from gfair.events.reasons import RejectionCode
from gfair.events.states import JobState
from gfair.state.job_failures import JobFailureRecord
from gfair.state.job_record import JobRecord
from gfair.state.profile_record import JobProfileRecord
from gfair.state.share_record import TradeRecord


@dataclass(frozen=True)
class Submitted:
    """A submission and how far the job got while the client waited."""

    user: str
    job_id: str
    event_id: str
    state: JobState
    reason: str | None = None
    code: RejectionCode | None = None
    servers: tuple[str, ...] = ()

    @property
    def ref(self) -> JobRef:
        return JobRef(user=self.user, job_id=self.job_id)

    @property
    def rejected(self) -> bool:
        return self.state is JobState.REJECTED


@dataclass(frozen=True)
class JobDetails:
    """A job's record and its life as events, oldest first."""

    user: str
    job_id: str
    record: JobRecord | None
    events: tuple[HistoricalEvent, ...]
    profile: JobProfileRecord | None = None
    failures: JobFailureRecord | None = None

    @property
    def ref(self) -> JobRef:
        return JobRef(user=self.user, job_id=self.job_id)

    @property
    def state(self) -> JobState:
        """The record's state; before placement wrote one, the last event's."""
        if self.record is not None:
            return self.record.state
        return state_after(self.events) or JobState.SUBMITTED


def state_after(events: tuple[HistoricalEvent, ...] | list[HistoricalEvent]) -> JobState | None:
    """The state the last state-changing event leads to (terminal states are final)."""
    state: JobState | None = None
    for event in events:
        data = event.data
        if isinstance(data, JobEvent) and data.JOB_STATE is not None:
            if state is not None and state.terminal:
                break
            state = data.JOB_STATE
    return state


@dataclass(frozen=True)
class PoolUsage:
    pool: str
    fair: float  # GPUs of share without trading
    entitled: float  # GPUs of share after trading
    gpu_seconds: float  # GPU time its jobs held there since `UsersView.usage_since`
    received: float  # average GPUs held there over that time


@dataclass(frozen=True)
class UserSummary:
    user: str
    tickets: float | None
    jobs: int
    demand: int
    pools: dict[str, PoolUsage]
    throughput_fair: float = 0.0
    throughput_entitled: float = 0.0
    account: str = ""  # its account's path in the shares file ("": the root)

    @property
    def entitled(self) -> float:
        return sum(p.entitled for p in self.pools.values())

    @property
    def received(self) -> float:
        return sum(p.received for p in self.pools.values())

    @property
    def gain(self) -> float:
        if self.throughput_fair <= 0:
            return 0.0
        return self.throughput_entitled / self.throughput_fair - 1.0


@dataclass(frozen=True)
class UsersView:
    """Every user's entitlement (trading auction) beside what it received (split-stride)."""

    users: list[UserSummary]
    capacity: dict[str, int] = field(default_factory=dict)
    trades: tuple[TradeRecord, ...] = ()
    revision: int | None = None
    computed_at: datetime | None = None
    usage_since: datetime | None = None
    as_of: datetime | None = None
