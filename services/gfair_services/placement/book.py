"""Placement's view of the live jobs: their records (with bucket revisions) and the sums that
pool choice and load balancing read on every decision, kept up to date as records change.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping

from gfair.core.cluster import Server
from gfair.state.job_record import JobRecord, StoredJob
from gfair_services.shares import ActiveJob, Shares, job_tickets


class JobBook:
    def __init__(self) -> None:
        self._jobs: dict[str, StoredJob] = {}
        self._user_demand: Counter[str] = Counter()  # GPUs of each user's live jobs
        self._used: Counter[tuple[str, str]] = Counter()  # (user, pool) -> GPUs placed there
        self._pool_demand: Counter[str] = Counter()  # pool -> GPUs placed there
        self._on_server: dict[str, dict[str, None]] = defaultdict(dict)  # server -> job keys

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, key: object) -> bool:
        return key in self._jobs

    def __iter__(self) -> Iterator[StoredJob]:
        return iter(self._jobs.values())

    def get(self, key: str) -> StoredJob | None:
        return self._jobs.get(key)

    def put(self, record: JobRecord, revision: int) -> None:
        """Remember `record` at `revision`; a terminal record is forgotten."""
        self._forget(record.key)
        if not record.live:
            return
        self._jobs[record.key] = StoredJob(record=record, revision=revision)
        self._count(record, 1)

    def remove(self, key: str) -> None:
        self._forget(key)

    def _forget(self, key: str) -> None:
        old = self._jobs.pop(key, None)
        if old is not None:
            self._count(old.record, -1)

    def _count(self, record: JobRecord, sign: int) -> None:
        self._user_demand[record.user] += sign * record.gpus
        if record.generation is not None and record.servers:
            self._used[(record.user, record.generation)] += sign * record.gpus
            self._pool_demand[record.generation] += sign * record.gpus
        for server in record.servers:
            if sign > 0:
                self._on_server[server][record.key] = None
            else:
                self._on_server[server].pop(record.key, None)
                if not self._on_server[server]:
                    del self._on_server[server]

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
        waiting = [s.record for s in self._jobs.values() if s.record.pending]
        return sorted(waiting, key=lambda r: (r.created_at, r.key))

    def placed_in(self, pool: str) -> list[JobRecord]:
        return [
            s.record
            for s in self._jobs.values()
            if s.record.generation == pool and s.record.servers
        ]

    def tickets(self, shares: Shares, surplus_weight: float) -> dict[str, float]:
        """Estimated stride tickets of every placed job (what split-stride will give it)."""
        return job_tickets(
            shares,
            (
                ActiveJob(r.key, r.user, r.generation, r.submission.weight)
                for r in (s.record for s in self._jobs.values())
                if r.generation is not None and r.servers
            ),
            surplus_weight,
        )

    def ticket_load(
        self, servers: Mapping[str, Server], tickets: Mapping[str, float]
    ) -> dict[str, float]:
        """Server -> tickets queued there; a gang weighs on each server by the GPUs it holds."""
        load: dict[str, float] = {}
        for server_id in servers:
            total = 0.0
            for record in self.on_server(server_id):
                share = tickets.get(record.key, 0.0)
                if len(record.servers) > 1:
                    held = sum(servers[s].gpus for s in record.servers if s in servers)
                    share *= servers[server_id].gpus / held if held else 0.0
                total += share
            load[server_id] = total
        return load
