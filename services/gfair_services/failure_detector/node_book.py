"""The failure detector's view of every node: liveness from heartbeats, and quarantine.

Liveness and quarantine are decided by `gfair.core.health`; this book keeps the facts those
functions need (when each node was last heard from, the failures held against it) and turns
their verdicts into node events and `NodeRecord`s. It reads no clock: `now` is an argument.

Liveness is measured on the detector's own clock (when a heartbeat was *handled*), not on the
sender's, so clock skew between machines cannot make a node look dead. A detector that lags
behind its heartbeats does not call `check` (the service asks the broker how many wait), so its
own backlog is not taken for the nodes' silence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from gfair.core.health import (
    HeartbeatPolicy,
    Liveness,
    NodeFailure,
    QuarantinePolicy,
    liveness,
    node_verdict,
    unheard,
)
from gfair.events.envelope import EventData
from gfair.events.fields import JobRef
from gfair.events.nodes import (
    NodeFailed,
    NodeHeartbeat,
    NodeQuarantined,
    NodeRecovered,
    NodeRegistered,
    NodeSuspected,
    NodeUncordoned,
)
from gfair.events.reasons import FailureClass
from gfair.events.states import NodeState
from gfair.state.node_record import (
    MAX_FAILURES_KEPT,
    MAX_TRANSITIONS_KEPT,
    NodeFailureEntry,
    NodeRecord,
    NodeTransition,
)
from gfair_services.failure_detector.change import NO_CHANGE, Change


@dataclass(frozen=True, slots=True)
class Lapse:
    """A node that fell silent: `cause` names the silence, so its events get stable ids."""

    node_id: str
    cause: str
    change: Change
    failed: bool


# How a failure the node reported itself is named (a heartbeat's `fault`), and later known.
FAULT = "the node reports a fault: "


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class NodeBook:
    def __init__(
        self,
        heartbeat: HeartbeatPolicy,
        quarantine: QuarantinePolicy,
        *,
        heartbeat_record_s: float = 10.0,
    ) -> None:
        self._heartbeat = heartbeat
        self._quarantine = quarantine
        self._heartbeat_record_s = heartbeat_record_s
        self._records: dict[str, NodeRecord] = {}
        self._last_seen: dict[str, float] = {}
        # Since when no node has been heard (`gfair.core.health.unheard`); None while some is.
        self.deaf_since: float | None = None

    # ----- state -------------------------------------------------------------------------

    def restore(self, records: Iterable[NodeRecord], now: datetime) -> None:
        """Load the bucket after a restart.

        Every node that was not failed gets a full grace period from `now`: heartbeats sent
        while the detector was down are still on its durable consumer, and judging a node
        before they are read would suspect healthy nodes.
        """
        for record in records:
            self._records[record.node_id] = record
            self._last_seen[record.node_id] = now.timestamp()

    def apply(self, change: Change, now: datetime) -> None:
        for record in change.nodes:
            previous = self._records.get(record.node_id)
            self._records[record.node_id] = record
            if previous is None or record.last_heartbeat != previous.last_heartbeat:
                self._last_seen[record.node_id] = now.timestamp()

    def get(self, node_id: str) -> NodeRecord | None:
        return self._records.get(node_id)

    def records(self) -> list[NodeRecord]:
        return [self._records[n] for n in sorted(self._records)]

    def last_seen(self, node_id: str) -> float | None:
        return self._last_seen.get(node_id)

    # ----- inputs ------------------------------------------------------------------------

    def registered(self, data: NodeRegistered, now: datetime) -> Change:
        self._hearing(now)
        record = self._records.get(data.node_id)
        generations = ", ".join(sorted(data.generations))
        inventory = {
            "hostname": data.hostname,
            "gpus": data.gpus,
            "simulated": data.simulated,
            "executor_version": data.executor_version,
            "heartbeat_interval_s": data.heartbeat_interval_s,
            "registered_at": now,
            "last_heartbeat": now,
            "heartbeat_seq": None,
            # A fresh executor runs nothing: it stopped whatever an earlier one left behind.
            "running": (),
        }
        if record is None:
            reason = f"registered with {len(data.gpus)} GPUs ({generations})"
            fresh = NodeRecord(
                node_id=data.node_id, state=NodeState.READY, state_since=now, **inventory
            )
            return Change(nodes=(_moved(fresh, NodeState.READY, reason, now),))
        events: list[EventData] = []
        if record.state in (NodeState.SUSPECTED, NodeState.FAILED):
            reason = f"re-registered after being {record.state.value}"
            events.append(NodeRecovered(node_id=data.node_id, reason=reason))
        else:
            reason = f"re-registered with {len(data.gpus)} GPUs ({generations})"
        state = NodeState.READY
        if record.quarantined:
            # A registration reads as "ready" to every consumer: say again that it is not.
            state = NodeState.QUARANTINED
            reason = f"re-registered, still quarantined: {record.quarantine_reason}"
            events.append(self._quarantined_event(record, reason))
        updated = _moved(record.model_copy(update=inventory), state, reason, now)
        return Change(events=tuple(events), nodes=(updated,))

    def heartbeat(
        self, data: NodeHeartbeat, now: datetime, jobs_on: Callable[[str], Iterable[JobRef]]
    ) -> Change:
        """Liveness heard; a node that reports a fault is failed (its jobs re-placed) until
        a heartbeat without one."""
        self._hearing(now)
        record = self._records.get(data.node_id)
        if record is None:
            # Heard of only through heartbeats (its registration predates this bucket):
            # track its liveness; its inventory arrives with its next registration.
            record = _moved(
                NodeRecord(node_id=data.node_id, state=NodeState.READY, state_since=now),
                NodeState.READY,
                "heartbeating, not registered since the detector's records began",
                now,
            )
            if data.fault is None:
                return Change(nodes=(_heard(record, data, now),))
        seen = self._last_seen.get(data.node_id, now.timestamp())
        if data.fault is not None and record.state is not NodeState.FAILED:
            jobs = tuple(dict.fromkeys((*record.running, *data.running, *jobs_on(data.node_id))))
            return self._failed(_heard(record, data, now), FAULT + data.fault, now, jobs)
        events: list[EventData] = []
        # (A failed node that still reports a fault stays failed.)
        if data.fault is None and record.state in (NodeState.SUSPECTED, NodeState.FAILED):
            silent = now.timestamp() - seen
            reason = f"heartbeats resumed after {silent:.1f}s of silence"
            if record.reason is not None and record.reason.startswith(FAULT):
                reason = "it reports no fault any more"
            events.append(NodeRecovered(node_id=data.node_id, reason=reason))
            state = NodeState.READY
            if record.quarantined:
                state = NodeState.QUARANTINED
                reason = f"{reason}; still quarantined: {record.quarantine_reason}"
                events.append(self._quarantined_event(record, reason))
            record = _moved(record, state, reason, now)
        elif not self._worth_writing(record, data, now):
            # Liveness lives in memory; the record is rewritten only when it tells something new.
            self._last_seen[data.node_id] = now.timestamp()
            return NO_CHANGE
        return Change(events=tuple(events), nodes=(_heard(record, data, now),))

    def uncordon(self, data: NodeUncordoned, now: datetime) -> Change:
        """An operator cleared the node's quarantine; failures before now no longer count."""
        record = self._records.get(data.node_id)
        if record is None or not record.quarantined:
            return NO_CHANGE
        who = data.operator or "an operator"
        reason = f"uncordoned by {who}" + (f": {data.reason}" if data.reason else "")
        cleared = record.model_copy(
            update={
                "quarantined": False,
                "quarantine_reason": None,
                "uncordoned_at": now,
                "uncordoned_by": data.operator,
                "recent_failures": (),
            }
        )
        events: list[EventData] = []
        if record.state is NodeState.QUARANTINED:
            return Change(nodes=(_moved(cleared, NodeState.READY, reason, now),))
        # "uncordoned" reads as "ready" to every consumer; a dead node is not.
        seen = self._last_seen.get(record.node_id)
        last = at(seen) if seen is not None else record.last_heartbeat
        if record.state is NodeState.FAILED:
            events.append(
                NodeFailed(
                    node_id=record.node_id,
                    reason=f"{reason}, but it is still failed ({record.reason})",
                    last_heartbeat=last,
                )
            )
        elif record.state is NodeState.SUSPECTED:
            events.append(
                NodeSuspected(
                    node_id=record.node_id,
                    missed_heartbeats=self._missed(record, now),
                    last_heartbeat=last,
                )
            )
        note = NodeTransition(time=now, state=record.state, reason=reason)
        cleared = cleared.model_copy(
            update={"transitions": (*record.transitions, note)[-MAX_TRANSITIONS_KEPT:]}
        )
        return Change(events=tuple(events), nodes=(cleared,))

    def failure(self, node_id: str, entry: NodeFailureEntry, now: datetime) -> Change:
        """Hold a failure against the node; quarantine it when the policy says so."""
        record = self._records.get(node_id)
        if record is None:
            return NO_CHANGE
        return self._held(record, entry, now)

    def check(self, now: datetime, jobs_on: Callable[[str], Iterable[JobRef]]) -> list[Lapse]:
        """Nodes whose silence moved them to suspected or failed since the last check."""
        lapses: list[Lapse] = []
        watched = self._watched()
        deaf = unheard(watched.values(), now.timestamp(), self._heartbeat)
        if deaf and self.deaf_since is None:
            self.deaf_since = now.timestamp()
        for node_id, record in sorted(self._records.items()):
            seen = watched.get(node_id)
            if seen is None:
                continue
            verdict = liveness(seen, now.timestamp(), self._heartbeat)
            if deaf and verdict is Liveness.FAILED:
                verdict = Liveness.SUSPECTED  # not failed while the detector may be deaf
            silent = now.timestamp() - seen
            cause = f"{node_id}@{seen!r}"
            if verdict is Liveness.FAILED:
                jobs = tuple(dict.fromkeys((*record.running, *jobs_on(node_id))))
                reason = (
                    f"no heartbeat for {silent:.1f}s "
                    f"(fails after {self._heartbeat.fail_after_s:g}s)"
                )
                change = self._failed(record, reason, now, jobs, last_heartbeat=at(seen))
                lapses.append(Lapse(node_id, f"{cause}/failed", change, failed=True))
            elif verdict is Liveness.SUSPECTED and record.state is not NodeState.SUSPECTED:
                reason = (
                    f"no heartbeat for {silent:.1f}s "
                    f"(suspected after {self._heartbeat.suspect_after_s:g}s)"
                )
                suspected = _moved(record, NodeState.SUSPECTED, reason, now)
                event = NodeSuspected(
                    node_id=node_id,
                    missed_heartbeats=self._missed(record, now),
                    last_heartbeat=at(seen),
                )
                lapses.append(
                    Lapse(
                        node_id,
                        f"{cause}/suspected",
                        Change(events=(event,), nodes=(suspected,)),
                        failed=False,
                    )
                )
        return lapses

    # ----- internals ---------------------------------------------------------------------

    def _failed(
        self,
        record: NodeRecord,
        reason: str,
        now: datetime,
        jobs: tuple[JobRef, ...],
        last_heartbeat: datetime | None = None,
    ) -> Change:
        """The node failed, `jobs` lost with it, a failure held against it."""
        failed = _moved(record, NodeState.FAILED, reason, now).model_copy(update={"running": ()})
        event = NodeFailed(
            node_id=record.node_id,
            reason=reason,
            last_heartbeat=last_heartbeat or record.last_heartbeat,
            jobs=jobs,
        )
        entry = NodeFailureEntry(time=now, failure_class=FailureClass.INFRASTRUCTURE, reason=reason)
        return Change(events=(event,), nodes=(failed,)) + self._held(failed, entry, now)

    def _watched(self) -> dict[str, float]:
        """When each node that is not failed was last heard."""
        return {
            node_id: self._last_seen[node_id]
            for node_id, record in self._records.items()
            if record.state is not NodeState.FAILED and node_id in self._last_seen
        }

    def _hearing(self, now: datetime) -> None:
        """A node is heard: if none had been for a while, the others' silence counts from now
        (they reconnect one by one after what deafened the detector)."""
        if self.deaf_since is None:
            return
        for node_id in self._watched():
            self._last_seen[node_id] = max(self._last_seen[node_id], now.timestamp())
        self.deaf_since = None

    def _held(self, record: NodeRecord, entry: NodeFailureEntry, now: datetime) -> Change:
        window_start = now.timestamp() - self._quarantine.window_s
        if record.uncordoned_at is not None:
            window_start = max(window_start, record.uncordoned_at.timestamp())
        recent = tuple(
            f for f in (*record.recent_failures, entry) if f.time.timestamp() > window_start
        )[-MAX_FAILURES_KEPT:]
        counts = dict(record.failure_counts)
        counts[entry.failure_class] = counts.get(entry.failure_class, 0) + 1
        record = record.model_copy(update={"recent_failures": recent, "failure_counts": counts})
        if record.quarantined:
            return Change(nodes=(record,))
        verdict = node_verdict(
            record.node_id,
            (
                NodeFailure(
                    node_id=record.node_id,
                    time=f.time.timestamp(),
                    kind=f.failure_class,
                    job_id=f.job_id or "",
                )
                for f in recent
            ),
            now.timestamp(),
            self._quarantine,
        )
        if not verdict.quarantine:
            return Change(nodes=(record,))
        record = record.model_copy(
            update={
                "quarantined": True,
                "quarantine_reason": verdict.reason,
                "quarantined_at": now,
            }
        )
        # A dead node stays failed; it comes back quarantined.
        state = NodeState.QUARANTINED if record.state is NodeState.READY else record.state
        record = _moved(record, state, f"quarantined: {verdict.reason}", now)
        return Change(events=(self._quarantined_event(record, verdict.reason),), nodes=(record,))

    def _quarantined_event(self, record: NodeRecord, reason: str) -> NodeQuarantined:
        return NodeQuarantined(
            node_id=record.node_id, reason=reason, recent_failures=len(record.recent_failures)
        )

    def _missed(self, record: NodeRecord, now: datetime) -> int:
        seen = self._last_seen.get(record.node_id, now.timestamp())
        interval = record.heartbeat_interval_s or 1.0
        return max(1, math.floor((now.timestamp() - seen) / interval))

    def _worth_writing(self, record: NodeRecord, data: NodeHeartbeat, now: datetime) -> bool:
        if tuple(data.running) != tuple(record.running) or record.last_heartbeat is None:
            return True
        return (now - record.last_heartbeat).total_seconds() >= self._heartbeat_record_s


def _heard(record: NodeRecord, data: NodeHeartbeat, now: datetime) -> NodeRecord:
    return record.model_copy(
        update={"last_heartbeat": now, "heartbeat_seq": data.seq, "running": data.running}
    )


def _moved(record: NodeRecord, state: NodeState, reason: str, now: datetime) -> NodeRecord:
    transition = NodeTransition(time=now, state=state, reason=reason)
    since = record.state_since if state is record.state else now
    return record.model_copy(
        update={
            "state": state,
            "state_since": since,
            "reason": reason,
            "transitions": (*record.transitions, transition)[-MAX_TRANSITIONS_KEPT:],
        }
    )
