"""`gfair why`: why a job is where it is, from the records of the services that decide.

Each service records the reasons of its own decisions; this only puts them side by side:
placement's record (admission, pool and servers, pending), split-stride's (its pass against
the others' on its server, the GPUs the jobs running there hold, a retry's back-off), the
trading auction's (its user's share against what its jobs ask) and the failure detector's
(the health of the servers it is placed on).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gfair.client.views import JobDetails
from gfair.events.states import JobState, NodeState
from gfair.state.buckets import job_key
from gfair.state.node_record import NodeRecord
from gfair.state.share_record import SharesRecord
from gfair.state.stride_record import StrideRecord

# Decisions of the job's record repeated at the end of an explanation, newest last.
RECENT_DECISIONS = 5
# Passes closer than this are equal (floating point sums of GPUs/tickets).
_PASS_EPS = 1e-9


@dataclass(frozen=True)
class Reason:
    kind: str  # state, pending, backoff, stride, gang, share, node, history
    text: str


@dataclass(frozen=True)
class Explanation:
    user: str
    job_id: str
    state: JobState
    headline: str
    reasons: list[Reason] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [self.headline, *(r.text for r in self.reasons)]


def explain(
    details: JobDetails,
    *,
    stride: StrideRecord | None,
    shares: SharesRecord | None,
    nodes: Sequence[NodeRecord],
    now: datetime,
) -> Explanation:
    record, state = details.record, details.state
    ref = f"{details.user}/{details.job_id}"
    reasons: list[Reason] = []
    if record is None:
        headline = f"{ref} is submitted; placement has not admitted it yet (is placement up?)"
        return Explanation(details.user, details.job_id, state, headline, reasons)
    if state is JobState.REJECTED:
        headline = f"{ref} was rejected ({record.rejection_code}): {record.reason}"
    elif state is JobState.COMPLETED:
        headline = f"{ref} completed after {record.attempt} attempt(s)"
    elif state is JobState.FAILED:
        headline = f"{ref} failed ({record.failure_class}): {record.reason}"
    elif state is JobState.CANCELLED:
        was = f" while {record.cancelled_from}" if record.cancelled_from else ""
        headline = f"{ref} was cancelled{was}" + (f": {record.reason}" if record.reason else "")
    elif state is JobState.RUNNING:
        headline = (
            f"{ref} is running on {', '.join(record.nodes) or ', '.join(record.servers)}"
            f" ({record.generation}), attempt {record.attempt}"
        )
    else:
        headline = f"{ref} is {state} and waits for GPUs"
        reasons += _waiting(details, stride, nodes, now)
    if not state.terminal:
        reasons += _share(details.user, shares)
    reasons += [
        Reason("history", f"{d.at:%H:%M:%S} {d.kind}: {d.text}")
        for d in record.decisions[-RECENT_DECISIONS:]
    ]
    return Explanation(details.user, details.job_id, state, headline, reasons)


def _waiting(
    details: JobDetails,
    stride: StrideRecord | None,
    nodes: Sequence[NodeRecord],
    now: datetime,
) -> list[Reason]:
    record = details.record
    assert record is not None
    reasons: list[Reason] = []
    for node in nodes:
        if not node.schedulable:
            why = node.quarantine_reason if node.quarantined else node.reason
            status = "quarantined" if node.quarantined else str(node.state)
            reasons.append(
                Reason(
                    "node",
                    f"its server {node.node_id} is {status}"
                    + (f": {why}" if why else "")
                    + ("; `gfair nodes uncordon` clears a quarantine" if node.quarantined else ""),
                )
            )
    if not record.servers:
        pending = [d for d in record.decisions if d.kind == "pending"]
        text = pending[-1].text if pending else "no registered server that fits it is up"
        reasons.append(Reason("pending", f"not placed on a server yet: {text}"))
        return reasons
    key = job_key(details.user, details.job_id)
    job = stride.jobs.get(key) if stride is not None else None
    if stride is None or job is None:
        reasons.append(
            Reason(
                "stride",
                f"placed on {', '.join(record.servers)}; split-stride has not scheduled it yet",
            )
        )
        return reasons
    if job.runnable_at is not None and job.runnable_at > now:
        wait_s = (job.runnable_at - now).total_seconds()
        cause = f" after {record.failure_class}: {record.reason}" if record.failure_class else ""
        reasons.append(
            Reason(
                "backoff",
                f"retry back-off: attempt {job.attempt} may start in {wait_s:.0f}s"
                f" ({job.runnable_at:%H:%M:%S}){cause}",
            )
        )
    if job.exited:
        reasons.append(
            Reason("backoff", "its process ended; the failure detector has not classified it yet")
        )
    for server in record.servers:
        reasons += _on_server(key, record.gpus, server, stride)
    return reasons


def _on_server(key: str, gpus: int, server: str, stride: StrideRecord) -> list[Reason]:
    reasons: list[Reason] = []
    entries = _queue(stride.split_stride, server)
    mine = entries.get(key)
    if mine is not None and len(entries) > 1:
        lowest_key = min(entries, key=lambda k: (entries[k][0], k))
        lowest = entries[lowest_key][0]
        if mine[0] > lowest + _PASS_EPS:
            reasons.append(
                Reason(
                    "stride",
                    f"on {server} its pass {mine[0]:.4g} is above the lowest, {lowest:.4g} "
                    f"({_job_name(lowest_key)}): lower passes run first; while it waits its "
                    "pass stays and the running jobs' passes grow",
                )
            )
        else:
            tied = sum(1 for k, e in entries.items() if k != key and e[0] <= mine[0] + _PASS_EPS)
            ties = f", tied with {tied} other job(s) (ties go by arrival)" if tied else ""
            reasons.append(
                Reason(
                    "stride",
                    f"on {server} it has the lowest pass ({mine[0]:.4g}){ties}: it runs as soon "
                    "as its GPUs fit and no multi-server gang claims the server",
                )
            )
    info = stride.servers.get(server)
    if info is not None:
        holding = stride.running_on(server)
        held = sum(len(indices) for k, indices in holding.items() if k != key)
        free = info.gpus - held
        if gpus > free and holding:
            others = ", ".join(
                f"{_job_name(k)} ({len(indices)})" for k, indices in sorted(holding.items())
            )
            reasons.append(
                Reason(
                    "gang",
                    f"needs {_gpus(gpus)} at once; {server} has {free} of {info.gpus} free, "
                    f"held by {others}",
                )
            )
        if info.state is not NodeState.READY:
            reasons.append(Reason("node", f"split-stride holds {server} as {info.state}"))
    return reasons


def _queue(snapshot: Mapping[str, Any], server: str) -> dict[str, tuple[float, int]]:
    """Job key -> (pass, GPUs) of the entries queued on `server` (local and central)."""
    out: dict[str, tuple[float, int]] = {}
    local = snapshot.get("servers", {}).get(server, {})
    entries: Iterable[Any] = local.get("jobs", []) if isinstance(local, Mapping) else []
    for entry in entries:
        out[str(entry["id"])] = (float(entry["pass"]), int(entry["gpus"]))
    for entry in snapshot.get("multi", []):
        if server in entry.get("servers", ()):
            out[str(entry["id"])] = (float(entry["pass"]), int(entry["gpus"]))
    return out


def _gpus(count: int) -> str:
    return f"{count} GPU" + ("" if count == 1 else "s")


def _job_name(key: str) -> str:
    user, _, job_id = key.partition(".")
    return f"{user}/{job_id}" if job_id else key


def _share(user: str, shares: SharesRecord | None) -> list[Reason]:
    if shares is None:
        return []
    share = shares.users.get(user)
    if share is None:
        return [Reason("share", f"{user} has no entitlement yet (the trading auction recomputes)")]
    entitled = sum(p.entitled for p in share.pools.values())
    per_pool = ", ".join(f"{g} {p.entitled:.2f}" for g, p in share.pools.items() if p.entitled)
    text = (
        f"{user} is entitled to {entitled:.2f} GPUs ({per_pool or 'none'}) and its "
        f"{share.jobs} active job(s) ask {share.demand}"
    )
    if share.demand > entitled + 1e-9:
        text += ": its jobs take turns within its share"
    return [Reason("share", text)]
