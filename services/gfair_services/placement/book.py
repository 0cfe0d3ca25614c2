"""Placement's view of the live jobs: their records (with bucket revisions) and the sums that
pool choice and load balancing read on every decision, kept up to date as records change, so a
decision costs in proportion to the servers and users involved, not to all the jobs.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping

from gfair.state.job_record import JobRecord, StoredJob
from gfair_services.shares import Shares, group_rate

Group = tuple[str, str]  # (user, pool)


class JobBook:
    def __init__(self, surplus_weight: float) -> None:
        self._surplus_weight = surplus_weight
        self._jobs: dict[str, StoredJob] = {}
        self._user_demand: Counter[str] = Counter()  # GPUs of each user's live jobs
        self._used: Counter[Group] = Counter()  # GPUs placed per (user, pool)
        self._pool_demand: Counter[str] = Counter()  # GPUs placed per pool
        self._members: Counter[Group] = Counter()  # placed jobs per (user, pool)
        self._weights: defaultdict[Group, float] = defaultdict(float)  # their weights
        self._placed_of_user: Counter[str] = Counter()
        self._on_server: dict[str, dict[str, None]] = defaultdict(dict)  # server -> job keys
        # server -> (user, pool) -> weight of that group's jobs there; a gang counts an equal
        # part on each of its servers (they are of one generation, hence usually one size).
        self._server_weights: dict[str, defaultdict[Group, float]] = defaultdict(
            lambda: defaultdict(float)
        )
        self._pending: dict[str, None] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, key: object) -> bool:
        return key in self._jobs

    def __iter__(self) -> Iterator[StoredJob]:
        return iter(list(self._jobs.values()))

    def get(self, key: str) -> StoredJob | None:
        return self._jobs.get(key)

    def put(self, record: JobRecord, revision: int) -> None:
        """Remember `record` at `revision`; a terminal record is forgotten."""
        self.remove(record.key)
        if not record.live:
            return
        self._jobs[record.key] = StoredJob(record=record, revision=revision)
        self._count(record, 1)

    def remove(self, key: str) -> None:
        old = self._jobs.pop(key, None)
        if old is not None:
            self._count(old.record, -1)

    def _count(self, record: JobRecord, sign: int) -> None:
        self._user_demand[record.user] += sign * record.gpus
        if record.pending:
            if sign > 0:
                self._pending[record.key] = None
            else:
                self._pending.pop(record.key, None)
        if record.generation is None or not record.servers:
            return
        group = (record.user, record.generation)
        weight = record.submission.weight
        self._used[group] += sign * record.gpus
        self._pool_demand[record.generation] += sign * record.gpus
        self._members[group] += sign
        self._weights[group] += sign * weight
        self._placed_of_user[record.user] += sign
        part = weight / len(record.servers)
        for server in record.servers:
            self._server_weights[server][group] += sign * part
            if sign > 0:
                self._on_server[server][record.key] = None
            else:
                self._on_server[server].pop(record.key, None)
                if not self._on_server[server]:
                    del self._on_server[server]
                    del self._server_weights[server]

    # -- what decisions read ------------------------------------------------------------

    def user_demand(self) -> Mapping[str, int]:
        return {user: gpus for user, gpus in self._user_demand.items() if gpus > 0}

    def used(self, user: str, pool: str) -> int:
        return self._used[(user, pool)]

    def pool_demand(self, pool: str) -> int:
        return self._pool_demand[pool]

    def on_server(self, server: str) -> list[JobRecord]:
        return [self._jobs[key].record for key in self._on_server.get(server, ())]

    def pending(self) -> list[JobRecord]:
        """Admitted jobs on no servers, oldest first (the order they are retried in)."""
        waiting = [self._jobs[key].record for key in self._pending]
        return sorted(waiting, key=lambda r: (r.created_at, r.key))

    def rate(self, shares: Shares, group: Group, *, joining: float = 0.0) -> float:
        """Stride tickets per unit of weight in `group` (with a job of weight `joining` added)."""
        user, pool = group
        extra = 1 if joining else 0
        return group_rate(
            shares.get(user, {}),
            pool,
            self._members[group] + extra,
            self._weights[group] + joining,
            self._placed_of_user[user] + extra,
            self._surplus_weight,
        )

    def tickets_of(self, record: JobRecord, shares: Shares) -> float:
        """Estimated stride tickets of a placed job (what split-stride will give it)."""
        if record.generation is None:
            return 0.0
        return self.rate(shares, (record.user, record.generation)) * record.submission.weight

    def ticket_load(self, servers: Mapping[str, object], shares: Shares) -> dict[str, float]:
        """Server -> tickets queued there (a gang weighs an equal part on each of its servers)."""
        rates: dict[Group, float] = {}
        load: dict[str, float] = {}
        for server in servers:
            total = 0.0
            for group, weight in self._server_weights.get(server, {}).items():
                if group not in rates:
                    rates[group] = self.rate(shares, group)
                total += rates[group] * weight
            load[server] = total
        return load
