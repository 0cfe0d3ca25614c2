"""What `gfair demo` shows: users' received share against their entitlement, what runs where,
the trades, and a running count of the scheduler's actions.

Received share is measured over a sliding window (`ShareWindow`) from split-stride's usage
counters (GPU-seconds per user per pool), so it follows the entitlement as it changes instead
of averaging over the whole run. A `DashboardFrame` is read once per refresh; the same snapshot is
drawn as rich tables on a terminal or as one plain line otherwise.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gfair.core.cluster import generation_rank
from gfair.events.jobs import JobEvent, JobSuspended
from gfair.events.reasons import SuspendReason
from gfair.events.states import JobState
from gfair.state.job_record import JobRecord
from gfair.state.share_record import SharesRecord
from gfair.state.stride_record import StrideRecord

Usage = Mapping[str, Mapping[str, float]]  # user -> pool -> GPU-seconds

# Event types counted, by the verb of their type name, in the order shown.
COUNTED = (
    "started",
    "suspended",
    "resumed",
    "migrated",
    "completed",
    "retried",
    "failed",
    "rejected",
)


class ShareWindow:
    """GPUs each user held per pool on average over the last `window_s` seconds.

    Split-stride charges usage at its ticks, a quantum at a time, so samples must be taken on
    its clock (`StrideRecord.last_tick_at`), not the reader's: two reads 2 s apart that straddle
    a tick would otherwise divide a whole quantum's GPU-seconds by 2 s.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, dict[str, dict[str, float]]]] = deque()

    def add_record(self, stride: StrideRecord) -> None:
        """Sample a split-stride record at its last tick (the first one also at `usage_since`,
        when nothing was charged yet, so that one read already has a span to measure)."""
        if stride.last_tick_at is None:
            return
        if not self._samples:
            self.add(stride.usage_since.timestamp(), {})
        self.add(stride.last_tick_at.timestamp(), stride.usage)

    def add(self, at: float, usage: Usage) -> None:
        if self._samples and at <= self._samples[-1][0]:
            return  # the same tick read again: nothing new was charged
        self._samples.append((at, {u: dict(p) for u, p in usage.items()}))
        # Keep one sample at or before the window's start, so the window is always full.
        while len(self._samples) > 2 and self._samples[1][0] <= at - self.window_s:
            self._samples.popleft()

    def span_s(self) -> float:
        """How long `received` averages over: at least the window once it filled, less before."""
        if len(self._samples) < 2:
            return 0.0
        return self._samples[-1][0] - self._samples[0][0]

    def received(self) -> dict[str, dict[str, float]]:
        if len(self._samples) < 2:
            return {}
        (start, before), (end, after) = self._samples[0], self._samples[-1]
        span = end - start
        if span <= 0:
            return {}
        return {
            user: {
                pool: max(seconds - before.get(user, {}).get(pool, 0.0), 0.0) / span
                for pool, seconds in pools.items()
            }
            for user, pools in after.items()
        }


@dataclass
class Tally:
    """Counts of the jobs' lifecycle events and of cleared trades, read incrementally."""

    events: Counter[str] = field(default_factory=Counter)
    trades: int = 0
    jobs_sequence: int = 0
    sched_sequence: int = 0

    def count(self, event: JobEvent) -> None:
        """Count a job event under its verb; a suspend that moves the job counts as a
        migration (the scheduler moves jobs through their checkpoints)."""
        verb = type(event).event_name()
        if isinstance(event, JobSuspended) and event.reason is SuspendReason.MIGRATION:
            verb = "migrated"
        if verb in COUNTED:
            self.events[verb] += 1


@dataclass(frozen=True)
class DashboardFrame:
    elapsed_s: float
    duration_s: float
    shares: SharesRecord | None
    stride: StrideRecord | None
    jobs: list[JobRecord]
    received: dict[str, dict[str, float]]
    tally: Tally
    speedups: Mapping[str, str]  # user -> what it gains from a V100
    received_over_s: float = 0.0  # the span `received` averages over (`ShareWindow.span_s`)


def pools_of(snapshot: DashboardFrame) -> list[str]:
    """Every pool the snapshot knows, fastest first (the pool everybody wants is the first
    column), in one fixed order whichever record names them: a column must not move between
    frames when the shares first appear or a pool's last node is cordoned."""
    pools: set[str] = set()
    if snapshot.shares is not None:
        pools |= set(snapshot.shares.capacity)
    if snapshot.stride is not None:
        pools |= {s.generation for s in snapshot.stride.servers.values()}
    return sorted(pools, key=generation_rank, reverse=True)


def job_counts(jobs: list[JobRecord], user: str) -> tuple[int, int, int]:
    """(running, waiting, done) jobs of `user`."""
    mine = [j for j in jobs if j.user == user]
    running = sum(1 for j in mine if j.state is JobState.RUNNING)
    done = sum(1 for j in mine if j.state.terminal)
    return running, len(mine) - running - done, done


def users_table(snapshot: DashboardFrame) -> Table:
    pools = pools_of(snapshot)
    table = Table(
        title="fair share: entitled (after trading, what its jobs can use) vs received "
        f"({received_over(snapshot)}), in GPUs",
        title_justify="left",
    )
    members = snapshot.shares.members if snapshot.shares is not None else {}
    table.add_column("user")
    if members:  # a shares file places users in accounts (`gfair shares show` sums them)
        table.add_column("account")
    table.add_column("tickets", justify="right")
    table.add_column("V100 speedup", justify="right")
    table.add_column("run/wait/done", justify="center")
    for pool in pools:
        table.add_column(f"{pool} ent/rcv", justify="right")
    table.add_column("no-trade", justify="right")
    table.add_column("entitled", justify="right")
    table.add_column("received", justify="right")
    table.add_column("trade gain", justify="right")
    users = sorted(set(snapshot.speedups) | set(snapshot.received))
    shares = snapshot.shares.users if snapshot.shares is not None else {}
    for user in users:
        share = shares.get(user)
        received = snapshot.received.get(user, {})
        running, waiting, done = job_counts(snapshot.jobs, user)
        row = [
            user,
            *([members.get(user, "-")] if members else []),
            f"{share.tickets:g}" if share else "-",
            snapshot.speedups.get(user, "?"),
            f"{running}/{waiting}/{done}",
        ]
        usable = share.usable() if share else {}
        for pool in pools:
            row.append(f"{usable.get(pool, 0.0):.2f}/{received.get(pool, 0.0):.2f}")
        fair = sum(p.fair for p in share.pools.values()) if share else 0.0
        entitled_total = sum(usable.values())
        row += [
            f"{fair:.2f}",
            f"{entitled_total:.2f}",
            f"{sum(received.values()):.2f}",
            f"{share.gain:+.0%}" if share else "-",
        ]
        table.add_row(*row)
    return table


def received_over(snapshot: DashboardFrame) -> str:
    """The span the received shares average over, as measured (split-stride's ticks)."""
    if snapshot.received_over_s <= 0:
        return "not measured yet: split-stride has not charged a quantum"
    return f"average over the last {snapshot.received_over_s:.0f}s"


def servers_table(snapshot: DashboardFrame) -> Table:
    table = Table(title="what runs where (this quantum)", title_justify="left")
    table.add_column("server")
    table.add_column("GPUs", justify="right")
    table.add_column("running jobs (GPUs)")
    stride = snapshot.stride
    if stride is None:
        return table
    for node_id in sorted(stride.servers):
        server = stride.servers[node_id]
        running = stride.running_on(node_id)
        busy = sum(len(gpus) for gpus in running.values())
        names = ", ".join(
            f"{key.replace('.', '/', 1)}({len(gpus)})" for key, gpus in sorted(running.items())
        )
        state = "" if server.state == "ready" else f" [{server.state}]"
        table.add_row(f"{node_id} ({server.generation}){state}", f"{busy}/{server.gpus}", names)
    return table


def trades_text(snapshot: DashboardFrame) -> Text:
    shares = snapshot.shares
    if shares is None or not shares.trades:
        # Trades end when their jobs do: "none" beside a count of cleared ones must say so.
        cleared = snapshot.tally.trades
        if cleared:
            return Text(f"trades in force: none now ({cleared} cleared earlier, since ended)")
        return Text("trades in force: none yet")
    lines = [
        f"  {t.buyer} buys {t.quantity:.2f} {t.fast_pool} GPUs from {t.seller} at "
        f"{t.price:.2f} {t.slow_pool} per {t.fast_pool} (bids {t.buyer_bid:.2f} vs "
        f"{t.seller_bid:.2f})"
        for t in shares.trades
    ]
    return Text("\n".join(["trades in force (second price):", *lines]))


def counters_text(snapshot: DashboardFrame) -> Text:
    counts = ", ".join(f"{name} {snapshot.tally.events[name]}" for name in COUNTED)
    return Text(f"jobs: {counts}; trades cleared: {snapshot.tally.trades}")


def dashboard(snapshot: DashboardFrame) -> Group:
    header = Text(
        f"gfair demo: {snapshot.elapsed_s:5.0f}s of {snapshot.duration_s:.0f}s", style="bold"
    )
    return panels(header, snapshot)


def panels(header: Text, snapshot: DashboardFrame) -> Group:
    """`header` over the cluster's panels: users, servers, trades and counts of events."""
    return Group(
        header,
        users_table(snapshot),
        servers_table(snapshot),
        trades_text(snapshot),
        counters_text(snapshot),
    )


def plain_line(snapshot: DashboardFrame) -> str:
    """One line per report when the output is not a terminal (CI logs, pipes)."""
    shares = snapshot.shares.users if snapshot.shares is not None else {}
    parts = []
    for user in sorted(set(snapshot.speedups) | set(snapshot.received)):
        share = shares.get(user)
        entitled = sum(share.usable().values()) if share else 0.0
        received = sum(snapshot.received.get(user, {}).values())
        parts.append(f"{user} ent {entitled:.1f} rcv {received:.1f}")
    tally = snapshot.tally
    return (
        f"[{snapshot.elapsed_s:4.0f}s] "
        + " | ".join(parts)
        + f" | trades {len(snapshot.shares.trades) if snapshot.shares else 0} in force,"
        + f" {tally.trades} cleared"
        + f" | done {tally.events['completed']} susp {tally.events['suspended']}"
        + f" migr {tally.events['migrated']}"
    )
