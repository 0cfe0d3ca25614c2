"""The simulator's books: who was active, entitled to what, and what each user received.

A user is *active* while it has admitted, unfinished jobs (running or waiting). Its entitlement
at any moment is its ticket share of the cluster's GPUs among the active users, water-filled by
demand (a user cannot use more GPUs than its active jobs ask for; the surplus goes to the others
in proportion to their tickets). This is the no-trading entitlement of docs/design.md §1.1,
the common yardstick for every policy. Received GPU time counts the GPUs a job requested for as
long as it held them (switching overhead included: the GPUs are held, if not yet productive).

With a `ShareTree` the entitlement is the tree's water-fill instead (down its accounts,
`gfair.core.shares_tree`), and each account with an active user below it is booked too: its
entitlement (the GPUs of its subtree) and what its users received, over its active time.

Integrals are kept exactly (piecewise-constant between events); `ShareSeries` additionally
buckets them over time for plots and windowed measurements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gfair.core.shares_tree import ShareTree
from gfair.core.tickets import water_fill


@dataclass(slots=True)
class UserAccount:
    """Totals for one user; `*_gpu_s` are GPU-seconds, `work_gpu_s` V100-equivalent ones."""

    tickets: float
    jobs: int = 0
    active_jobs: int = 0
    demand_gpus: int = 0
    active_s: float = 0.0
    entitled_gpu_s: float = 0.0
    gpu_s: float = 0.0
    work_gpu_s: float = 0.0


@dataclass(slots=True)
class AccountTotals:
    """Totals for one account of a `ShareTree`, its subtree's users together."""

    tickets: float
    active_s: float = 0.0
    entitled_gpu_s: float = 0.0
    gpu_s: float = 0.0


@dataclass(frozen=True, slots=True)
class WindowTotals:
    """One user's totals over a time window (see `ShareSeries.window`)."""

    received_share: float  # of the cluster's GPU time in the window
    entitled_share: float
    throughput: float  # V100-equivalent GPU-seconds of work per second of the window


class ShareSeries:
    """Per-user integrals in time buckets; adjacent buckets merge when there are too many."""

    def __init__(self, capacity: int, start: float, bucket_s: float, max_buckets: int) -> None:
        if bucket_s <= 0 or max_buckets < 2:
            raise ValueError("bucket_s must be > 0 and max_buckets >= 2")
        self.capacity = capacity
        self.start = start
        self.bucket_s = bucket_s
        self.max_buckets = max_buckets
        self.gpu_s: dict[str, list[float]] = {}
        self.work_gpu_s: dict[str, list[float]] = {}
        self.entitled_gpu_s: dict[str, list[float]] = {}
        self._length = 0

    def add(
        self, table: dict[str, list[float]], user: str, begin: float, end: float, rate: float
    ) -> None:
        """Add `rate` per second over [begin, end) to `table[user]`, split across buckets."""
        if end <= begin or rate == 0:
            return
        last = int((end - self.start) / self.bucket_s)
        while last >= self.max_buckets:
            self._merge()
            last = int((end - self.start) / self.bucket_s)
        if last >= self._length:
            self._grow(last + 1)
        values = table.get(user)
        if values is None:
            values = table[user] = [0.0] * self._length
        width = self.bucket_s
        index = int((begin - self.start) / width)
        while begin < end:
            edge = min(end, self.start + (index + 1) * width)
            values[index] += rate * (edge - begin)
            begin = edge
            index += 1

    def _grow(self, length: int) -> None:
        for table in (self.gpu_s, self.work_gpu_s, self.entitled_gpu_s):
            for values in table.values():
                values.extend([0.0] * (length - len(values)))
        self._length = length

    def _merge(self) -> None:
        for table in (self.gpu_s, self.work_gpu_s, self.entitled_gpu_s):
            for user, values in table.items():
                if len(values) % 2:
                    values.append(0.0)
                table[user] = [values[i] + values[i + 1] for i in range(0, len(values), 2)]
        self._length = (self._length + 1) // 2
        self.bucket_s *= 2

    @property
    def users(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.gpu_s) | set(self.entitled_gpu_s)))

    def times(self) -> list[float]:
        """Start time of every bucket."""
        return [self.start + i * self.bucket_s for i in range(self._length)]

    def shares(self, user: str, table: dict[str, list[float]]) -> list[float]:
        """`table[user]` per bucket as a fraction of the cluster's GPU time in the bucket."""
        denominator = self.capacity * self.bucket_s
        values = table.get(user, [])
        return [value / denominator for value in values] + [0.0] * (self._length - len(values))

    def window(self, begin: float, end: float) -> dict[str, WindowTotals]:
        """Totals over the whole buckets inside [begin, end)."""
        first = max(0, int(-(-(begin - self.start) // self.bucket_s)))
        stop = min(self._length, int((end - self.start) // self.bucket_s))
        if stop <= first:
            raise ValueError(f"no whole bucket of {self.bucket_s:g}s inside [{begin}, {end})")
        seconds = (stop - first) * self.bucket_s
        gpu_seconds = self.capacity * seconds

        def total(table: dict[str, list[float]], user: str) -> float:
            return sum(table.get(user, [])[first:stop])

        return {
            user: WindowTotals(
                received_share=total(self.gpu_s, user) / gpu_seconds,
                entitled_share=total(self.entitled_gpu_s, user) / gpu_seconds,
                throughput=total(self.work_gpu_s, user) / seconds,
            )
            for user in self.users
        }


class Ledger:
    """Exact per-user integrals, fed by the simulator as events happen."""

    def __init__(
        self,
        capacity: int,
        tickets: Mapping[str, float],
        default_tickets: float,
        series: ShareSeries | None = None,
        tree: ShareTree | None = None,
    ) -> None:
        self.capacity = capacity
        self.tickets = dict(tickets)
        self.default_tickets = default_tickets
        self.series = series
        self.tree = tree
        self.accounts: dict[str, UserAccount] = {}
        # The tree's accounts, booked as users are (module doc); empty without a tree.
        self.tree_accounts: dict[str, AccountTotals] = (
            {path: AccountTotals(t) for path, t in tree.accounts.items()} if tree else {}
        )
        self._account_entitled: dict[str, float] = {}
        self.busy_gpu_s = 0.0
        self._entitled: dict[str, float] = {}
        self._since = 0.0

    def account(self, user: str) -> UserAccount:
        account = self.accounts.get(user)
        if account is None:
            tickets = self.tickets.get(user, self.default_tickets)
            if self.tree is not None:
                tickets = self.tree.tickets_of(user, tickets)
            account = self.accounts[user] = UserAccount(tickets=tickets)
        return account

    def admit(self, now: float, user: str, gpus: int) -> None:
        self._change_demand(now, user, gpus, +1)
        self.accounts[user].jobs += 1

    def depart(self, now: float, user: str, gpus: int) -> None:
        self._change_demand(now, user, -gpus, -1)

    def used(self, user: str, gpus: int, begin: float, end: float, work: float) -> None:
        """`user` held `gpus` GPUs over [begin, end) and did `work` V100-seconds per GPU."""
        held = end - begin
        if held <= 0:
            return
        account = self.accounts[user]
        account.gpu_s += gpus * held
        account.work_gpu_s += gpus * work
        self.busy_gpu_s += gpus * held
        if self.tree is not None:
            for path in self.tree.ancestors(self.tree.account_of(user)):
                self.tree_accounts[path].gpu_s += gpus * held
        if self.series is not None:
            self.series.add(self.series.gpu_s, user, begin, end, gpus)
            self.series.add(self.series.work_gpu_s, user, begin, end, gpus * work / held)

    def close(self, now: float) -> None:
        """Integrate entitlements up to `now` (call before reading the totals)."""
        self._integrate(now)

    def _change_demand(self, now: float, user: str, gpus: int, jobs: int) -> None:
        self._integrate(now)
        account = self.account(user)
        account.active_jobs += jobs
        account.demand_gpus += gpus
        demand = {
            name: float(each.demand_gpus)
            for name, each in self.accounts.items()
            if each.active_jobs > 0
        }
        tickets = {name: self.accounts[name].tickets for name in demand}
        if self.tree is None:
            self._entitled = water_fill(float(self.capacity), tickets, demand)
        else:
            fill = self.tree.fill(float(self.capacity), tickets, demand)
            self._entitled, self._account_entitled = fill.users, fill.accounts

    def _integrate(self, now: float) -> None:
        elapsed = now - self._since
        if elapsed > 0:
            for user, gpus in self._entitled.items():
                account = self.accounts[user]
                account.active_s += elapsed
                account.entitled_gpu_s += gpus * elapsed
                if self.series is not None:
                    self.series.add(self.series.entitled_gpu_s, user, self._since, now, gpus)
            for path, gpus in self._account_entitled.items():
                totals = self.tree_accounts[path]
                totals.active_s += elapsed
                totals.entitled_gpu_s += gpus * elapsed
        self._since = max(self._since, now)
