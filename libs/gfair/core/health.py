"""Node health: heartbeat liveness, quarantine of nodes that keep failing jobs.

See docs/design.md §2.6.

Both are pure functions of the facts given (last heartbeat, failure history) and `now`.

- Liveness: a node silent for longer than `suspect_after_s` is *suspected*; longer than
  `fail_after_s`, *failed* (its jobs are to be re-placed).
- Deafness: when every one of two or more nodes is silent at once (`unheard`), the likelier
  cause is that the detector cannot hear (the broker lost or restarting, its own feed stalled),
  not that every node died together; no node is then declared failed, and once the detector
  hears any node again the others' silence counts from then (as Kubernetes' node controller
  stops evicting in a "full disruption"). A single node's silence is always its own.
- Lag: silence is measured from when the detector *read* a node's heartbeat. A detector that
  has a heartbeat of every node still unread (`behind`) would take its own backlog for the
  nodes' silence; it judges no node until it has read them, and a node that really stopped
  is then found from when its last heartbeat was read. Where the broker cannot say how many
  wait (it is too loaded to answer), the heartbeats read say it themselves (`lagging`): the
  freshest one read was sent long ago.
- Quarantine: a node on which jobs failed with infrastructure errors at least `max_failures`
  times within the last `window_s` seconds is to be quarantined until an operator clears it.
  Other failure classes say nothing about the node and are not counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from gfair.core.failure import FailureClass


class Liveness(StrEnum):
    ALIVE = "alive"
    SUSPECTED = "suspected"
    FAILED = "failed"


@dataclass(frozen=True)
class HeartbeatPolicy:
    suspect_after_s: float = 15.0
    fail_after_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.suspect_after_s <= self.fail_after_s:
            raise ValueError("need 0 < suspect_after_s <= fail_after_s")


def liveness(last_heartbeat: float, now: float, policy: HeartbeatPolicy | None = None) -> Liveness:
    policy = policy or HeartbeatPolicy()
    silent = now - last_heartbeat
    if silent > policy.fail_after_s:
        return Liveness.FAILED
    if silent > policy.suspect_after_s:
        return Liveness.SUSPECTED
    return Liveness.ALIVE


def unheard(last_heard: Iterable[float], now: float, policy: HeartbeatPolicy | None = None) -> bool:
    """Whether the detector itself is likely deaf: two or more nodes, none of them alive."""
    policy = policy or HeartbeatPolicy()
    times = list(last_heard)
    return len(times) >= 2 and all(
        liveness(seen, now, policy) is not Liveness.ALIVE for seen in times
    )


def behind(unread: int, nodes: int) -> bool:
    """Whether `unread` heartbeats waiting for the detector are a round of them or more: a
    heartbeat interval's lag at least, which silence measured on read times would count."""
    return nodes > 0 and unread >= nodes


def lagging(newest_sent: float | None, now: float, policy: HeartbeatPolicy | None = None) -> bool:
    """Whether the freshest heartbeat the detector has read (`newest_sent`: when its node sent
    it) is more than half a suspicion old: the detector reads its feed late or not at all, and
    would take its own lag for the nodes' silence. Any node sending keeps it fresh, so one node
    that stopped is still judged; only the detector's own lag (or every node's silence, which
    `unheard` holds from failing anyway) makes it stale."""
    policy = policy or HeartbeatPolicy()
    return newest_sent is not None and now - newest_sent > policy.suspect_after_s / 2


@dataclass(frozen=True)
class NodeFailure:
    node_id: str
    time: float
    kind: FailureClass
    job_id: str = ""


@dataclass(frozen=True)
class QuarantinePolicy:
    max_failures: int = 3
    window_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.max_failures < 1:
            raise ValueError(f"max_failures must be >= 1, got {self.max_failures}")
        if self.window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")


@dataclass(frozen=True)
class NodeVerdict:
    node_id: str
    quarantine: bool
    failures_in_window: int
    reason: str


def node_verdict(
    node_id: str,
    history: Iterable[NodeFailure],
    now: float,
    policy: QuarantinePolicy | None = None,
) -> NodeVerdict:
    policy = policy or QuarantinePolicy()
    since = now - policy.window_s
    recent = [
        f
        for f in history
        if f.node_id == node_id and f.kind is FailureClass.INFRASTRUCTURE and since < f.time <= now
    ]
    count = len(recent)
    window = f"{policy.window_s:g}s"
    if count >= policy.max_failures:
        reason = (
            f"{count} infrastructure failures in the last {window} (limit {policy.max_failures})"
        )
        return NodeVerdict(node_id, True, count, reason)
    return NodeVerdict(
        node_id, False, count, f"{count} infrastructure failures in the last {window}"
    )


def nodes_to_quarantine(
    history: Iterable[NodeFailure], now: float, policy: QuarantinePolicy | None = None
) -> tuple[NodeVerdict, ...]:
    """Verdicts of every node in `history` that is to be quarantined, by node id."""
    history = tuple(history)
    nodes = sorted({f.node_id for f in history})
    verdicts = (node_verdict(n, history, now, policy) for n in nodes)
    return tuple(v for v in verdicts if v.quarantine)
