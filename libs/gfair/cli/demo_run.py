"""One run of the demo workload against a running cluster: submit, watch, summarise.

Kept apart from how the cluster is started (`gfair demo` starts an embedded one), so the same
run can be pointed at any cluster a client can reach.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.live import Live
from rich.table import Table

from gfair.bus.history import read_history
from gfair.cli.demo_dashboard import DashboardFrame, ShareWindow, Tally, dashboard, plain_line
from gfair.cli.demo_workload import JOBS, USERS, DemoJob
from gfair.client import GfairClient, Submitted
from gfair.events.jobs import JobEvent
from gfair.events.scheduling import TradeCleared
from gfair.events.subjects import JOBS_STREAM, SCHED_STREAM
from gfair.state.share_record import SharesRecord


@dataclass
class DemoOptions:
    duration_s: float = 150.0
    refresh_s: float = 1.0
    window_s: float = 20.0
    # Without a terminal, one line this often.
    report_every_s: float = 10.0
    jobs: Sequence[DemoJob] = JOBS


@dataclass
class DemoResult:
    submitted: list[Submitted] = field(default_factory=list)
    snapshot: DashboardFrame | None = None
    # Time-weighted sums over the run, per user: usable entitled GPUs x seconds, and its
    # effective throughput without and with trading x seconds.
    entitled_s: dict[str, float] = field(default_factory=dict)
    throughput_fair_s: dict[str, float] = field(default_factory=dict)
    throughput_traded_s: dict[str, float] = field(default_factory=dict)

    def trade_gain(self, user: str) -> float | None:
        fair = self.throughput_fair_s.get(user, 0.0)
        if fair <= 0:
            return None
        return self.throughput_traded_s.get(user, 0.0) / fair - 1.0

    usage_start: dict[str, dict[str, float]] = field(default_factory=dict)
    elapsed_s: float = 0.0


class DemoRun:
    def __init__(self, client: GfairClient, options: DemoOptions, console: Console) -> None:
        self.client = client
        self.options = options
        self.console = console
        self.window = ShareWindow(options.window_s)
        self.tally = Tally()
        self.result = DemoResult()
        self._pending = sorted(options.jobs, key=lambda j: j.at)
        self._started = 0.0

    async def run(self) -> DemoResult:
        self._started = time.monotonic()
        await self._submit_due()
        snapshot = await self.sample()
        if self.console.is_terminal:
            with Live(dashboard(snapshot), console=self.console, refresh_per_second=4) as live:
                await self._loop(lambda s: live.update(dashboard(s)))
        else:
            last_report = -self.options.report_every_s

            def report(s: DashboardFrame) -> None:
                nonlocal last_report
                if s.elapsed_s - last_report >= self.options.report_every_s:
                    last_report = s.elapsed_s
                    self.console.print(plain_line(s), highlight=False, soft_wrap=True)

            report(snapshot)
            await self._loop(report)
        self.result.elapsed_s = time.monotonic() - self._started
        return self.result

    async def _loop(self, show: Callable[[DashboardFrame], None]) -> None:
        previous = time.monotonic()
        while (now := time.monotonic()) - self._started < self.options.duration_s:
            await asyncio.sleep(min(self.options.refresh_s, self._left()))
            await self._submit_due()
            snapshot = await self.sample()
            now = time.monotonic()
            self._accumulate(snapshot.shares, now - previous)
            previous = now
            show(snapshot)

    def _left(self) -> float:
        return max(self.options.duration_s - (time.monotonic() - self._started), 0.0)

    def _accumulate(self, shares: SharesRecord | None, seconds: float) -> None:
        if shares is None:
            return
        result = self.result
        for user, share in shares.users.items():
            for totals, value in (
                (result.entitled_s, sum(share.usable().values())),
                (result.throughput_fair_s, share.throughput_fair),
                (result.throughput_traded_s, share.throughput_entitled),
            ):
                totals[user] = totals.get(user, 0.0) + seconds * value

    async def _submit_due(self) -> None:
        elapsed = time.monotonic() - self._started
        while self._pending and self._pending[0].at * self.options.duration_s <= elapsed:
            job = self._pending.pop(0)
            self.result.submitted.append(
                await self.client.submit(
                    job.user,
                    job.gpus,
                    job.command(self.options.duration_s),
                    job_type=job.job_type,
                    name=job.name,
                    job_id=job.name,
                    wait="none",
                )
            )

    async def sample(self) -> DashboardFrame:
        shares = await self.client.shares()
        stride = await self.client.stride()
        jobs = await self.client.jobs()
        now = time.monotonic()
        if stride is not None:
            if not self.result.usage_start:
                self.result.usage_start = {u: dict(p) for u, p in stride.usage.items()}
            self.window.add_record(stride)
        await self._count_events()
        snapshot = DashboardFrame(
            elapsed_s=now - self._started,
            duration_s=self.options.duration_s,
            shares=shares,
            stride=stride,
            jobs=jobs,
            received=self.window.received(),
            received_over_s=self.window.span_s(),
            tally=self.tally,
            speedups={u.name: u.speedup for u in USERS},
        )
        self.result.snapshot = snapshot
        return snapshot

    async def _count_events(self) -> None:
        bus = self.client.bus
        async for event in read_history(
            bus, JOBS_STREAM.name, start_sequence=self.tally.jobs_sequence + 1
        ):
            self.tally.jobs_sequence = event.sequence
            if isinstance(event.data, JobEvent):
                self.tally.count(event.data)
        async for event in read_history(
            bus,
            SCHED_STREAM.name,
            filter_subjects=(TradeCleared.subject_pattern(),),
            start_sequence=self.tally.sched_sequence + 1,
        ):
            self.tally.sched_sequence = event.sequence
            self.tally.trades += 1


def summary(result: DemoResult) -> Table:
    """Per user over the whole run: average entitlement against average GPUs received."""
    snapshot = result.snapshot
    table = Table(
        title="summary per user, time-averaged over the run: GPUs entitled (usable) and "
        "received; throughput gained by trading"
    )
    table.add_column("user")
    for column in ("tickets", "V100 speedup", "jobs done", "entitled", "received", "trade gain"):
        table.add_column(column, justify="right")
    if snapshot is None:
        return table
    elapsed = max(result.elapsed_s, 1e-9)
    usage = snapshot.stride.usage if snapshot.stride is not None else {}
    used_all = sum(sum(p.values()) for p in usage.values()) - sum(
        sum(p.values()) for p in result.usage_start.values()
    )
    gpus = sum(s.gpus for s in snapshot.stride.servers.values()) if snapshot.stride else 0
    if gpus:
        table.caption = f"GPUs busy: {used_all / (gpus * elapsed):.0%} of {gpus} over the run"
    for user in USERS:
        done = sum(1 for j in snapshot.jobs if j.user == user.name and j.state.terminal)
        total = sum(1 for j in snapshot.jobs if j.user == user.name)
        used = sum(usage.get(user.name, {}).values()) - sum(
            result.usage_start.get(user.name, {}).values()
        )
        gain = result.trade_gain(user.name)
        table.add_row(
            user.name,
            f"{user.tickets:g}",
            user.speedup,
            f"{done}/{total}",
            f"{result.entitled_s.get(user.name, 0.0) / elapsed:.2f}",
            f"{used / elapsed:.2f}",
            f"{gain:+.0%}" if gain is not None else "-",
        )
    return table
