"""Where jobs go: pool and servers for a job, and the moves that even out ticket load.

A thin layer over the core: `placement.choose_pool` (fastest pool where the user has unused
entitlement, then surplus, then least oversubscribed), `placement.choose_servers` (least ticket
load; gangs larger than a server take whole servers of one generation) and
`balance.propose_migrations` (threshold and budget). What it adds is the live inputs: the ready
nodes, the live jobs, the published entitlements and profiles.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gfair.core.balance import Resident, propose_migrations, spread
from gfair.core.cluster import Server
from gfair.core.placement import PoolView, choose_pool, choose_servers
from gfair.core.pools import Pool
from gfair.core.throughput import ThroughputEstimator
from gfair.events.scheduling import EntitlementsUpdated, ProfileUpdated
from gfair.state.job_record import JobRecord
from gfair_services.inventory import NodeInventory
from gfair_services.shares import user_shares

from .book import JobBook
from .settings import Settings


@dataclass(frozen=True, slots=True)
class Placement:
    generation: str
    servers: tuple[str, ...]
    rule: str
    reason: str


@dataclass(frozen=True, slots=True)
class Unplaceable:
    reason: str


@dataclass(frozen=True, slots=True)
class Move:
    job_key: str
    from_server: str
    to_server: str
    reason: str


class Placer:
    def __init__(self, settings: Settings, estimator: ThroughputEstimator) -> None:
        self._settings = settings
        self._estimator = estimator
        self._entitlements: dict[str, dict[str, float]] | None = None
        self._entitlements_revision = -1
        # (user, job type) -> generation -> rate: the profiler's latest estimate.
        self._profiles: dict[tuple[str, str | None], dict[str, float]] = {}

    # -- inputs from other services -----------------------------------------------------

    def entitlements_updated(self, event: EntitlementsUpdated) -> bool:
        """Take newer published entitlements; False for a stale or repeated revision."""
        if event.revision <= self._entitlements_revision:
            return False
        self._entitlements_revision = event.revision
        self._entitlements = {u: dict(e) for u, e in event.entitlements.items()}
        return True

    def profile_updated(self, event: ProfileUpdated) -> None:
        if event.job_id is None:  # per-job estimates refine little beyond the user's
            self._profiles[(event.user, event.job_type)] = dict(event.rates)

    # -- decisions ------------------------------------------------------------------------

    def speeds(
        self, user: str, job_type: str | None, generations: tuple[str, ...]
    ) -> dict[str, float]:
        """Relative speed of a job of `user` and `job_type` on each generation; 0: cannot run."""
        speeds = self._estimator.type_speeds(user, job_type, generations)
        measured = self._profiles.get((user, job_type))
        if measured is not None and all(measured.get(g, 0.0) > 0 for g in generations):
            speeds = {g: measured[g] for g in generations}
        return {g: (v if self._estimator.fits(job_type, g) else 0.0) for g, v in speeds.items()}

    def shares(self, book: JobBook, pools: Mapping[str, Pool]) -> dict[str, dict[str, float]]:
        demand = book.user_demand()
        return user_shares(
            {g: pool.gpus for g, pool in pools.items()},
            self._settings.tickets_map(demand),
            demand,
            self._entitlements,
        )

    def infeasible(self, record: JobRecord, inventory: NodeInventory) -> str | None:
        """Why the job could never run on any registered node (None: it could, or none known)."""
        pools = inventory.pools(ready_only=False)
        if not pools:
            return None  # a cluster still coming up: accept and wait
        sub = record.submission
        speeds = self.speeds(record.user, sub.job_type, tuple(pools))
        views = [PoolView(pool, speeds[g], 0.0, 0.0, 0.0) for g, pool in pools.items()]
        choice = choose_pool(sub.gpus, sub.job_type, views)
        return None if choice.accepted else choice.reason

    def place(
        self, record: JobRecord, inventory: NodeInventory, book: JobBook
    ) -> Placement | Unplaceable:
        """Pool and servers for `record`, which `book` must already count (unplaced)."""
        pools = inventory.pools(ready_only=True)
        if not pools:
            return Unplaceable("no ready GPU server is registered")
        sub = record.submission
        speeds = self.speeds(record.user, sub.job_type, tuple(pools))
        shares = self.shares(book, pools)
        entitled = shares.get(record.user, {})
        views = [
            PoolView(
                pool,
                speeds[g],
                entitled.get(g, 0.0),
                book.used(record.user, g),
                book.pool_demand(g),
            )
            for g, pool in pools.items()
        ]
        choice = choose_pool(sub.gpus, sub.job_type, views)
        if choice.pool is None:
            return Unplaceable(choice.reason)
        pool = pools[choice.pool]
        servers = {s.id: s for s in pool.servers}
        mine = self._placed_rate(book, shares, record, pool.generation) * sub.weight
        load = book.ticket_load(servers, shares)
        chosen = choose_servers(pool, sub.gpus, mine, load)
        if not chosen:
            return Unplaceable(
                f"{pool.generation}: no server or group of servers fits {sub.gpus} GPUs"
            )
        where = ", ".join(chosen)
        how = "least ticket load" if len(chosen) == 1 else "whole servers, least ticket load"
        return Placement(
            pool.generation, chosen, choice.rule, f"{choice.reason}; on {where} ({how})"
        )

    @staticmethod
    def _placed_rate(
        book: JobBook, shares: Mapping[str, Mapping[str, float]], record: JobRecord, pool: str
    ) -> float:
        """Tickets per weight the job will have in `pool` (it joins its user's jobs there)."""
        group = (record.user, pool)
        if record.generation == pool and record.servers:
            return book.rate(shares, group)  # already counted there
        return book.rate(shares, group, joining=record.submission.weight)

    def rebalance(self, inventory: NodeInventory, book: JobBook) -> list[Move]:
        """Moves that even out ticket load among each pool's ready servers (core balancer)."""
        pools = inventory.pools(ready_only=True)
        shares = self.shares(book, pools)
        budget = self._settings.migration_budget
        moves: list[Move] = []
        for pool in pools.values():
            if len(moves) >= budget or len(pool.servers) < 2:
                continue
            servers: dict[str, Server] = {s.id: s for s in pool.servers}
            load = book.ticket_load(servers, shares)
            if spread(pool.servers, load) <= self._settings.balance_threshold:
                continue

            def residents_of(server_id: str) -> list[Resident]:
                # Gangs weigh on their servers (in `load`) but only move whole, after failures.
                return [
                    Resident(r.key, r.gpus, book.tickets_of(r, shares))
                    for r in book.on_server(server_id)
                    if len(r.servers) == 1
                ]

            for move in propose_migrations(
                pool.servers,
                load,
                residents_of,
                self._settings.balance_threshold,
                budget - len(moves),
            ):
                before = load[move.from_server] / servers[move.from_server].gpus
                after = load[move.to_server] / servers[move.to_server].gpus
                moves.append(
                    Move(
                        move.job_id,
                        move.from_server,
                        move.to_server,
                        f"ticket load {before:.3g} on {move.from_server} vs {after:.3g} on "
                        f"{move.to_server} (tickets per GPU)",
                    )
                )
        return moves
