"""The kernel's input and output, and the state one decision's passes share (`Cycle`).

A driver hands `decide` a `Snapshot` (frozen: pools and their servers, each active user's
`UserState`, each runnable job's `RunnableJob`) and gets a `Decision`. Between the two, every
pass reads and writes one `Cycle`: the pools' free GPUs (`packing`), the jobs chosen so far and
where (`chosen`), the GPUs charged to each user (`charged`), and which pass chose each job
(`chosen_by`).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from gfair.core.cluster import Server
from gfair.core.packing import Packing
from gfair.core.switch_costs import DEFAULT_COSTS

# The quantum's length unless the operator sets one: what every driver and the kernel default to.
DEFAULT_QUANTUM_S: Final = 60.0

EPS = 1e-9
# Keys the kernel sorts and looks up by, at C speed (a decision applies them to every job).
ID = operator.attrgetter("id")
USER = operator.attrgetter("job.user")
TOTAL = operator.attrgetter("total")


@dataclass(slots=True)
class RunnableJob:
    """A runnable job as the kernel sees it. Drivers own these records; `decide` reads them."""

    id: str
    user: str
    gpus: int
    seq: int  # arrival order, the last tie-break
    speeds: dict[str, float]  # generation -> relative speed; 0: its type does not fit there
    pass_: float = 0.0  # GPU-quanta received while contended / weight, from the user's minimum
    weight: float = 1.0  # its part of its user's share, relative to the user's other jobs
    running: tuple[str, ...] = ()  # servers it held last quantum
    home: tuple[str, ...] = ()  # servers holding its latest checkpoint
    # Seconds of progress it loses starting on other servers than `running`/`home` (a move),
    # and resuming on `home` after a suspend (gfair.core.switch_costs)
    move_s: float = DEFAULT_COSTS.migration_s
    resume_s: float = DEFAULT_COSTS.resume_s


@dataclass(slots=True)
class UserState:
    name: str
    seq: int  # arrival order of the user (ties between equal priorities)
    entitled: dict[str, float] = field(default_factory=dict)  # pool -> GPUs of share
    credit: dict[str, float] = field(default_factory=dict)  # pool -> GPU-quanta owed


@dataclass(frozen=True, slots=True)
class PoolState:
    generation: str
    servers: tuple[Server, ...]
    speed_rank: int  # 0 for the fastest pool
    # Every GPU free, made once per pool (drivers pass the same pools quantum after quantum,
    # and a decision packs each pool several times): `empty` copies it.
    _empty: list[Packing] = field(default_factory=list, init=False, repr=False, compare=False)

    def empty(self) -> Packing:
        """A packing of the pool with every GPU free."""
        if not self._empty:
            self._empty.append(Packing(self.servers))
        return self._empty[0].copy()


@dataclass(frozen=True, slots=True)
class Snapshot:
    pools: Sequence[PoolState]  # fastest first
    users: Mapping[str, UserState]
    # user -> its runnable jobs in the order its share goes to them: by pass, then arrival
    # (drivers keep them sorted, so a quantum costs what runs, not what waits)
    jobs: Mapping[str, Sequence[RunnableJob]]
    # user -> pool -> GPU-quanta its jobs held beyond what earlier decisions gave them (a job
    # told to stop that went on holding its GPUs until its node reported it off), for `settle`
    # to charge; the simulator's jobs stop when told, so it has none
    overrun: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # user -> pool -> GPU-quanta the last booked decision charged it for that its jobs did not
    # hold: a job it ran started late (the GPUs' last holder was still yielding, or its node
    # took time to launch it), for `settle` to give back; the simulator's jobs start when
    # told, so it has none
    unheld: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # The quantum's length: what a move's seconds are weighed against (rule 8)
    quantum_s: float = DEFAULT_QUANTUM_S


@dataclass(frozen=True, slots=True)
class Decision:
    runs: Mapping[str, tuple[str, ...]]  # server id -> jobs holding GPUs on it this quantum
    placed: Mapping[str, tuple[str, ...]]  # job id -> servers, for every job that runs
    charged: Mapping[str, Mapping[str, float]]  # user -> pool -> GPUs run on its entitlement
    waiting: int  # runnable jobs that do not run this quantum
    # pool -> GPUs no job holds this quantum: none of the waiting jobs fits them (the decision
    # is work-conserving), so they are owed to nobody (`settle`)
    idle: Mapping[str, int] = field(default_factory=dict)
    served: frozenset[str] = frozenset()  # users with a job running this quantum
    entitled: frozenset[str] = frozenset()  # jobs run on their users' entitlement (charged)
    # job id -> the pass that chose it, or last moved it to another pool (`Pass`)
    chosen_by: Mapping[str, str] = field(default_factory=dict)


class Pass:
    """The passes' names, as a `Decision` reports them (`chosen_by`)."""

    STRIDE: Final = "stride"
    SURPLUS: Final = "surplus"
    FAST_FIRST: Final = "fast-first"
    FASTEST: Final = "fastest-to-fastest"
    BACKFILL: Final = "backfill"  # between quanta (`backfill`), not in a `Decision`

    @staticmethod
    def describe(name: str, generation: str) -> str:
        """Why the pass `name` ran a job in pool `generation`, in words."""
        match name:
            case Pass.STRIDE:
                return f"stride, its user's share of {generation}"
            case Pass.SURPLUS:
                return f"surplus, {generation} GPUs their users left idle"
            case Pass.FAST_FIRST:
                return f"moved to a faster pool, {generation} (fast-first)"
            case Pass.FASTEST:
                return f"nobody waits, and it gains most on {generation} (fastest-to-fastest)"
            case Pass.BACKFILL:
                return f"backfill, {generation} GPUs left idle between quanta"
        return name


@dataclass(slots=True)
class Choice:
    job: RunnableJob
    pool: str
    servers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ServerPools:
    """Server id -> its pool: as the pool's index (fastest first), generation and state; and
    its GPUs."""

    rank: dict[str, int]
    generation: dict[str, str]
    state: dict[str, PoolState]
    size: dict[str, int]


# The layout of the pools decided last, held with them (compared by identity): drivers pass
# the same pools quantum after quantum, and between quanta (`backfill`) often.
_last: list[tuple[tuple[PoolState, ...], ServerPools]] = []


def server_pools(pools: Sequence[PoolState]) -> ServerPools:
    if _last:
        kept, maps = _last[0]
        if len(kept) == len(pools) and all(map(operator.is_, kept, pools)):
            return maps
    maps = ServerPools(
        {server.id: rank for rank, pool in enumerate(pools) for server in pool.servers},
        {server.id: pool.generation for pool in pools for server in pool.servers},
        {server.id: pool for pool in pools for server in pool.servers},
        {server.id: server.gpus for pool in pools for server in pool.servers},
    )
    _last[:] = [(tuple(pools), maps)]
    return maps


class Cycle:
    """One decision's state, shared by its passes in turn: the snapshot, the pools' free GPUs,
    the jobs chosen and where, what each user was charged, and which pass chose each job."""

    __slots__ = (
        "charged",
        "chosen",
        "chosen_by",
        "layout",
        "order",
        "packing",
        "pools",
        "snapshot",
    )

    def __init__(self, snapshot: Snapshot, *, empty: bool = True) -> None:
        """`empty`: every GPU free to start with (else the caller sets `packing`)."""
        self.snapshot = snapshot
        self.pools = list(snapshot.pools)
        self.layout = server_pools(self.pools)
        self.packing = {p.generation: p.empty() for p in self.pools} if empty else {}
        self.chosen: dict[str, Choice] = {}
        self.chosen_by: dict[str, str] = {}
        # user -> its runnable jobs, for the users with any
        self.order = {user: jobs for user, jobs in snapshot.jobs.items() if jobs}
        self.charged: dict[str, dict[str, float]] = {}

    def choose(self, choice: Choice, by: str) -> None:
        self.chosen[choice.job.id] = choice
        self.chosen_by[choice.job.id] = by


def own(job: RunnableJob) -> tuple[str, ...]:
    """The servers the job starts on without moving: where it ran, else its checkpoint's."""
    return job.running or job.home


def prefer(job: RunnableJob) -> tuple[tuple[str, ...], ...]:
    # Servers of another pool are simply not free in this one.
    return (job.running, job.home)


def priority(credit: float, entitled: float) -> float:
    # Rounded so that equal passes reached by different sums of fractions tie exactly, and the
    # tie-break (arrival order) decides, as in integer stride.
    return round((credit + entitled) / entitled, 9)


def fastest_for(job: RunnableJob, pools: Sequence[PoolState]) -> list[PoolState]:
    """The pools `job` can run in, fastest for it first."""
    fitting = [p for p in pools if job.speeds.get(p.generation, 0.0) > 0]
    return sorted(fitting, key=lambda p: -job.speeds[p.generation])
