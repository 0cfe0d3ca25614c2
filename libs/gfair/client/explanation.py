"""`gfair why`: why a job is where it is, from the records of the services that decide.

Each service records the reasons of its own decisions; this only puts them side by side:
placement's record (admission, the placements the scheduler announced), split-stride's (the
kernel's account of its user per pool, its pass among its user's jobs, the GPUs the jobs on its
last servers hold, a retry's back-off), the
trading auction's (its user's share against what its jobs ask, and with a shares file each
account above it and the level that holds it back) and the failure detector's
(the health of the servers it is placed on). A job held for its dependencies (`after_ok`) is
explained by their states; a job array's member beyond the array's limit by the members that
run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gfair.client.views import JobDetails
from gfair.events.states import JobState, NodeState
from gfair.state.buckets import job_key
from gfair.state.node_record import NodeRecord
from gfair.state.share_record import SharesRecord, UserShare
from gfair.state.stride_record import StrideJob, StrideRecord

# Decisions of the job's record repeated at the end of an explanation, newest last.
RECENT_DECISIONS = 5


@dataclass(frozen=True)
class Reason:
    kind: str  # state, pending, backoff, stride, gang, share, account, node, history
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
    dependencies: Mapping[str, JobState] | None = None,
    viewer: str | None = None,
) -> Explanation:
    """Why `details`' job is where it is; `dependencies` are the states of the jobs its
    `after_ok` names (absent: unknown). For a `viewer`, jobs of other users go unnamed."""
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
    elif state is JobState.HELD:
        waiting = [
            d
            for d in record.submission.after_ok
            if (dependencies or {}).get(d) is not JobState.COMPLETED
        ]
        headline = (
            f"{ref} is held until {', '.join(waiting) or 'its dependencies'} complete "
            "successfully (after_ok); it counts toward no demand meanwhile"
        )
        for dependency in record.submission.after_ok:
            dep_state = (dependencies or {}).get(dependency)
            reasons.append(
                Reason("dependency", f"{details.user}/{dependency} is {dep_state or 'unknown'}")
            )
    else:
        headline = f"{ref} is {state} and waits for GPUs"
        reasons += _waiting(details, stride, nodes, now, viewer)
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
    viewer: str | None,
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
    key = job_key(details.user, details.job_id)
    job = stride.jobs.get(key) if stride is not None else None
    array = record.submission.array
    if stride is not None and array is not None and array.limit is not None:
        members = [
            j
            for j in stride.jobs.values()
            if j.user == details.user and j.array == array.id and j.array_limit is not None
        ]
        limit = min((j.array_limit for j in members if j.array_limit), default=array.limit)
        running = sum(1 for j in members if any(r.phase.holds_gpus for r in j.residency))
        reasons.append(
            Reason(
                "array",
                f"its array {array.id} runs at most {limit} at once; {running} of its "
                f"{len(members)} unfinished member(s) hold GPUs",
            )
        )
    if stride is None or job is None:
        reasons.append(
            Reason("stride", "admitted; split-stride has not taken it in yet (is split-stride up?)")
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
    reasons += _account(key, details.user, stride)
    for server in job.servers:
        reasons += _on_server(key, record.gpus, server, stride, viewer)
    return reasons


def _account(key: str, user: str, stride: StrideRecord) -> list[Reason]:
    """Where the job stands with the kernel: its user's credit per pool, its place among its
    user's jobs (docs/design.md §2.7)."""
    reasons: list[Reason] = []
    account = stride.users.get(user)
    if account is not None and account.credit:
        owed = ", ".join(f"{g} {c:+.3g}" for g, c in sorted(account.credit.items()))
        reasons.append(
            Reason(
                "stride",
                f"{user}'s credit per pool, in GPU-quanta (positive: owed, it runs first): {owed}",
            )
        )
    job = stride.jobs[key]
    ahead = [
        other
        for other_key, other in stride.jobs.items()
        if other.user == user
        and other_key != key
        and (other.stride_pass, other.seq) < (job.stride_pass, job.seq)
    ]
    if ahead:
        reasons.append(Reason("stride", _ahead(user, job.stride_pass, ahead)))
    return reasons


def _ahead(user: str, its_pass: float, ahead: list[StrideJob]) -> str:
    """Why `ahead` come first: a lower pass, or (most often while none has run) the same pass
    and an earlier submission, which is how ties are broken."""
    lower = [o for o in ahead if o.stride_pass < its_pass]
    tied = len(ahead) - len(lower)
    why = []
    if lower:
        why.append(
            f"{len(lower)} with a lower pass (from {min(o.stride_pass for o in lower):.4g}; "
            f"its is {its_pass:.4g})"
        )
    if tied:
        why.append(f"{tied} with the same pass, submitted earlier")
    return (
        f"{len(ahead)} of {user}'s other jobs come before it: {' and '.join(why)}; a user's "
        "share goes to its jobs in order of their passes"
    )


def _on_server(
    key: str, gpus: int, server: str, stride: StrideRecord, viewer: str | None
) -> list[Reason]:
    reasons: list[Reason] = []
    info = stride.servers.get(server)
    if info is not None:
        holding = stride.running_on(server)
        held = sum(len(indices) for k, indices in holding.items() if k != key)
        free = info.gpus - held
        if gpus > free and holding:
            others = ", ".join(
                f"{_job_name(k, viewer)} ({len(indices)})" for k, indices in sorted(holding.items())
            )
            reasons.append(
                Reason(
                    "gang",
                    f"needs {_gpus(gpus)} at once; {server}, where it last ran, has {free} of "
                    f"{info.gpus} free, held by {others}",
                )
            )
        if info.state is not NodeState.READY:
            reasons.append(Reason("node", f"split-stride holds {server} as {info.state}"))
    return reasons


def _gpus(count: int) -> str:
    return f"{count} GPU" + ("" if count == 1 else "s")


def _job_name(key: str, viewer: str | None) -> str:
    user, _, job_id = key.partition(".")
    if viewer is not None and user != viewer:
        return "another user's job"
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
    return [Reason("share", text), *_levels(user, share, shares)]


def _levels(user: str, share: UserShare, shares: SharesRecord) -> list[Reason]:
    """With a shares file: every account above the user, nearest first, with its fair share
    (before trading: its tickets' part, weighed by decayed usage in the decayed mode) and what
    its users ask; and, when the user asks more than its own fair share, the level that holds
    it back: the one nearest the root whose subtree asks more than its fair share
    (docs/design.md §1.1: a user held back by the water-fill has every account above it over its
    share too, and the division is top-down, so the highest such level gives way first)."""
    fair = sum(p.fair for p in share.pools.values())
    chain = [(f"user {user}", fair, float(share.demand))]
    reasons: list[Reason] = []
    path = shares.members.get(user, "")
    while path and path in shares.accounts:
        account = shares.accounts[path]
        reasons.append(
            Reason(
                "account",
                f"its account {path} ({account.tickets:g} tickets) holds {account.fair:.2f} "
                f"GPUs of fair share; its users ask {account.demand:g}",
            )
        )
        chain.append((f"account {path}", account.fair, account.demand))
        path = path.rpartition("/")[0]
    over = [(name, held, asked) for name, held, asked in chain if asked > held + 1e-9]
    if reasons and over and over[0][0] == chain[0][0]:
        name, held, asked = over[-1]
        reasons.append(
            Reason(
                "account",
                f"held back at {name}: it asks {asked:g} GPUs, more than its {held:.2f} of "
                "fair share",
            )
        )
    return reasons
