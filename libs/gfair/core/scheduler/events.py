"""The state machine's inputs (`SplitStride.apply`, `SplitStride.tick`): what happened, as
frozen values. Times are seconds since the epoch; `now` is when the driver handled the event
(by its own clock), `at` when the event happened (by its reporter's clock)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, TypeAlias

from gfair.core.cluster import Server
from gfair.core.switch_costs import MeasuredSwitches, SwitchCosts

from .residency import job_key

if TYPE_CHECKING:
    from .plan import Start, Stop


class NodeHealth(StrEnum):
    READY = "ready"
    SUSPECTED = "suspected"  # missed heartbeats: no new work, its jobs keep their time slices
    FAILED = "failed"  # its processes died with it
    QUARANTINED = "quarantined"  # kept failing jobs: drained

    @property
    def takes_new_work(self) -> bool:
        """Placement sends jobs only to ready nodes."""
        return self is NodeHealth.READY

    @property
    def schedulable(self) -> bool:
        """Split stride keeps time-slicing a merely suspected node's jobs."""
        return self is NodeHealth.READY or self is NodeHealth.SUSPECTED


@dataclass(frozen=True, slots=True)
class Node:
    node_id: str
    generation: str
    gpu_indices: tuple[int, ...]
    health: NodeHealth = NodeHealth.READY

    @property
    def gpus(self) -> int:
        return len(self.gpu_indices)

    @property
    def takes_new_work(self) -> bool:
        return self.health.takes_new_work

    @property
    def schedulable(self) -> bool:
        return self.health.schedulable

    def server(self) -> Server:
        return Server(self.node_id, self.generation, self.gpus)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobInput:
    user: str
    job_id: str
    now: float

    @property
    def key(self) -> str:
        return job_key(self.user, self.job_id)


@dataclass(frozen=True, slots=True)
class Launch:
    """How its user asked the job to run (the event contract's `JobLaunch`, field for field),
    and the ids that join its commands to the job's life: the driver builds its start commands
    from it; the machine reads only the limits (`time_limit`: seconds running, holding GPUs,
    after which the job is ended, `SplitStride.tick`)."""

    command: tuple[str, ...]
    env: Mapping[str, str]
    working_dir: str | None = None
    image: str | None = None  # None: a process on the node
    mounts: tuple[str, ...] = ()
    correlation_id: str | None = None  # the job's correlation id (its submission's event)
    trace_parent: str | None = None  # W3C traceparent in the job's trace
    time_limit: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Admitted(JobInput):
    """A job may run (its dependencies are met); `prepare`: it opted in to a prepared start;
    `costs`: what a resume and a move cost it until measured, when it says (a simulated trace's
    row; None: the operator's); `launch`: what its start needs, kept with the job for the
    driver (None: the driver knows it otherwise, or needs none)."""

    gpus: int
    weight: float
    job_type: str | None
    attempt: int = 1
    array: str | None = None
    array_limit: int | None = None
    prepare: bool = False
    costs: SwitchCosts | None = None
    launch: Launch | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Retried(JobInput):
    attempt: int
    at: float
    delay_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Started(JobInput):
    """Its node started (or resumed) the job."""

    node_id: str
    attempt: int
    gpu_indices: tuple[int, ...]
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Suspended(JobInput):
    """Its node suspended the job (`in_place`: its process waits there, off its GPUs;
    `starting`: forced off before its first mini-batch, while still coming up)."""

    node_id: str
    attempt: int
    in_place: bool
    at: float
    starting: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Migrated(JobInput):
    """The job's process on `node_id` checkpointed and left for other servers."""

    node_id: str
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Exited(JobInput):
    """The job's process on `node_id` ended (the failure detector's verdict follows)."""

    node_id: str
    attempt: int
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Parked(JobInput):
    """A prepared start's process came up without GPUs on `node_id` and waits there."""

    node_id: str
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Ended(JobInput):
    """The job is over for good (`state`: completed, failed, cancelled)."""

    state: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Unstartable(JobInput):
    """The driver could not send the start on `node_id` (nothing says what the job runs)."""

    node_id: str


@dataclass(frozen=True, slots=True)
class Releases:
    """Nodes' reports that processes let go (`Suspended`, `Migrated`, `Exited`), handed in
    together: each is folded in as alone, and the GPUs they leave idle go to waiting jobs once,
    after the last (at its `now`), instead of once per report."""

    reports: tuple[Suspended | Migrated | Exited, ...]


@dataclass(frozen=True, slots=True)
class CarriedOut:
    """Nodes that act at once (`SchedulerConfig.moves_at_once`: the simulator's) ran a plan's or a
    reply's `stops`, then its `starts`, at `now`, and reported each at once: the same as the
    stops' reports handed in together (`Releases`: `Suspended`, not in place, or `Migrated` for
    a move; a kill or a release has none), if any, then each start's `Started`, all heard at
    `now`. What the releases let start is the answer, as `Releases`'s. (One input instead of
    one per command: the simulator confirms some hundred thousand of them a run.)"""

    now: float
    stops: tuple[Stop, ...]
    starts: tuple[Start, ...]


@dataclass(frozen=True, slots=True)
class ServersChanged:
    """The servers known now, each with its health (a whole inventory, not a difference)."""

    nodes: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class EntitlementsPublished:
    """The trading auction's entitlements: user -> pool -> GPUs."""

    revision: int
    entitlements: Mapping[str, Mapping[str, float]]


@dataclass(frozen=True, slots=True)
class TypeProfiled:
    """A user's measured speeds of a job type: pool -> relative speed."""

    user: str
    job_type: str | None
    rates: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class SwitchesMeasured:
    """A job's switch costs as estimated from `reports` switch reports."""

    user: str
    job_id: str
    reports: int
    switches: MeasuredSwitches

    @property
    def key(self) -> str:
        return job_key(self.user, self.job_id)


@dataclass(frozen=True, slots=True)
class Tick:
    """A quantum boundary. `heard_until`: the driver has read every report its nodes sent
    before then (None: before `now`; a live service behind on its reports says how far)."""

    now: float
    heard_until: float | None = None


JobEvent: TypeAlias = (
    Admitted | Retried | Started | Suspended | Migrated | Exited | Parked | Ended | Unstartable
)
Event: TypeAlias = (
    JobEvent
    | Releases
    | CarriedOut
    | ServersChanged
    | EntitlementsPublished
    | TypeProfiled
    | SwitchesMeasured
)
