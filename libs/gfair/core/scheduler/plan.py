"""The state machine's outputs: what each node must do, as frozen values a driver carries out
(a service turns them into commands, in the order given)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .events import Started, Suspended
from .residency import Phase, job_key


class StopReason(StrEnum):
    TIME_SLICE = "time_slice"  # its time slice is over; it resumes here later
    MIGRATION = "migration"  # it runs on other servers next
    DRAIN = "drain"  # its server is no longer scheduled (quarantined)
    RELEASE = "release"  # its process parked here is let go: it starts elsewhere, or nowhere


@dataclass(frozen=True, slots=True)
class Placement:
    """The job runs on other servers than before (or for the first time)."""

    user: str
    job_id: str
    servers: tuple[str, ...]
    generation: str
    # The kernel's pass that put it there (`kernel.Pass`); None for a prepared start
    chosen_by: str | None = None


@dataclass(frozen=True, slots=True)
class Start:
    user: str
    job_id: str
    attempt: int
    node_id: str
    gpu_indices: tuple[int, ...]
    servers: tuple[str, ...]  # all of the gang's
    generation: str | None
    # A node where the job is parked in place, told to let go (checkpoint and exit) first.
    release: str | None = None
    # Its node runs it only until then: past it the machine may have forgotten the start and
    # run the job elsewhere (`turns.start_deadline`). None: no deadline (a driver's own start).
    valid_until: float | None = None

    @property
    def key(self) -> str:
        return job_key(self.user, self.job_id)

    def started(self, at: float) -> Started:
        """Its node's report that it ran this start at `at` (heard of then)."""
        return Started(
            user=self.user,
            job_id=self.job_id,
            now=at,
            node_id=self.node_id,
            attempt=self.attempt,
            gpu_indices=self.gpu_indices,
            at=at,
        )


@dataclass(frozen=True, slots=True)
class Stop:
    user: str
    job_id: str
    node_id: str
    attempt: int
    reason: StopReason | str  # a str reason means kill, not suspend

    @property
    def kill(self) -> bool:
        return not isinstance(self.reason, StopReason)

    def suspended(self, at: float, *, in_place: bool = False, starting: bool = False) -> Suspended:
        """Its node's report that it suspended the job at `at` (heard of then)."""
        return Suspended(
            user=self.user,
            job_id=self.job_id,
            now=at,
            node_id=self.node_id,
            attempt=self.attempt,
            in_place=in_place,
            at=at,
            starting=starting,
        )


@dataclass(frozen=True, slots=True)
class Prepare:
    """Start the job's process on `node_id` without GPUs, to wait there parked."""

    user: str
    job_id: str
    attempt: int
    node_id: str
    generation: str
    gpus: int


@dataclass(frozen=True, slots=True)
class ServerTurn:
    """What changes on one server in `quantum`: stops first, then starts; and what runs
    afterwards."""

    node_id: str
    quantum: int
    central: bool
    stops: tuple[Stop, ...]
    starts: tuple[Start, ...]
    running: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Forgotten:
    """A start or suspend no node confirmed in time, dropped."""

    job: str
    node_id: str
    phase: Phase
    start_confirmed: bool


@dataclass(frozen=True, slots=True)
class TimedOut:
    """A job the machine ended: its running time passed its limit (`Launch.time_limit`). The
    driver kills it (`kills`, before the plan's starts) and says it failed, with `reason`."""

    user: str
    job_id: str
    attempt: int
    reason: str
    kills: tuple[Stop, ...]


@dataclass(frozen=True, slots=True)
class QuantumPlan:
    quantum: int
    turns: tuple[ServerTurn, ...]
    # Jobs to stop on nodes that are no longer scheduled (quarantined): drained.
    strays: tuple[Stop, ...]
    placed: tuple[Placement, ...]  # jobs the kernel placed on other servers than before
    waiting: int  # runnable jobs that hold no GPUs this quantum
    forgotten: tuple[Forgotten, ...] = ()
    # Of every decision: jobs chosen that found too few free GPUs (a bug if ever non-empty).
    short: tuple[tuple[str, str], ...] = ()
    timed_out: tuple[TimedOut, ...] = ()  # ended before the decision


@dataclass(frozen=True, slots=True)
class Starts:
    """Starts between ticks, and the jobs they place on other servers than before."""

    turns: tuple[ServerTurn, ...] = ()
    placed: tuple[Placement, ...] = ()

    def __add__(self, other: Starts) -> Starts:
        return Starts(self.turns + other.turns, self.placed + other.placed)


@dataclass(frozen=True, slots=True)
class Reply:
    """What an event changed (`changed`: False, nothing, and nothing is to be done), and what
    follows from it: stops first (kills of a job that ended, a prepared process let go), then
    starts, then prepared starts. `ignored` says why an event that might have mattered did
    not."""

    changed: bool
    stops: tuple[Stop, ...] = ()
    starts: Starts = Starts()
    prepares: tuple[tuple[Placement, Prepare], ...] = ()
    ignored: str | None = None


UNCHANGED = Reply(False)
CHANGED = Reply(True)
