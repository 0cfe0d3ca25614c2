"""The split-stride state machine: every scheduling decision of the live cluster
(docs/design.md §2.3, §2.7).

`SplitStride` holds the servers, the admitted jobs and where they run (`residency`), and the
users' accounts. A driver feeds it what happened (`events`: a job admitted, retried, started,
suspended, migrated, exited or ended, several such releases at once, the commands of a plan
carried out by nodes that act at once; the servers changed;
entitlements, profiles and switch costs published) through `apply`, which answers what changed
and what to do about it (`plan`: starts between ticks, kills, a prepared start), and calls
`tick` at every quantum boundary for the quantum's plan: per server, who stops and why, who
starts on which GPU indices (`turns`). Each quantum decides with the decision kernel
(`gfair.core.kernel`) from a `snapshot` of the machine, whose job input the machine keeps up to
date as events arrive (`queues`). The machine is pure: time is given (seconds since the epoch),
nothing is logged (a plan says what a driver may log), nothing is stored (`Saved` is what a
driver persists and restores it from). Every input and its outcome can be recorded (`journal`)
and replayed.

The split-stride service drives it, and so does the simulator's `gandiva-fair` policy (with
`SchedulerConfig.moves_at_once`: its nodes let go at once); tests/services/test_parity.py shows
that the two feed it alike. The paper's reference split stride (per-server and central strides)
is `gfair.sim.baselines.paper_split_stride`.
"""

from .config import SchedulerConfig
from .events import (
    Admitted,
    CarriedOut,
    Ended,
    EntitlementsPublished,
    Event,
    Exited,
    JobEvent,
    Launch,
    Migrated,
    Node,
    NodeHealth,
    Parked,
    Releases,
    Retried,
    ServersChanged,
    Started,
    Suspended,
    SwitchesMeasured,
    Tick,
    TypeProfiled,
    Unstartable,
)
from .journal import Recording, replay
from .machine import Journal, Saved, SplitStride
from .plan import (
    Forgotten,
    Placement,
    Prepare,
    QuantumPlan,
    Reply,
    ServerTurn,
    Start,
    Starts,
    Stop,
    StopReason,
    TimedOut,
)
from .residency import Phase, SchedulerJob, Stay, Switches

__all__ = [
    "Admitted",
    "CarriedOut",
    "Ended",
    "EntitlementsPublished",
    "Event",
    "Exited",
    "Forgotten",
    "JobEvent",
    "Journal",
    "Launch",
    "Migrated",
    "Node",
    "NodeHealth",
    "Parked",
    "Phase",
    "Placement",
    "Prepare",
    "QuantumPlan",
    "Recording",
    "Releases",
    "Reply",
    "Retried",
    "Saved",
    "SchedulerConfig",
    "SchedulerJob",
    "ServerTurn",
    "ServersChanged",
    "SplitStride",
    "Start",
    "Started",
    "Starts",
    "Stay",
    "Stop",
    "StopReason",
    "Suspended",
    "Switches",
    "SwitchesMeasured",
    "Tick",
    "TimedOut",
    "TypeProfiled",
    "Unstartable",
    "replay",
]
