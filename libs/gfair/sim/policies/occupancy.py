"""Free GPUs per server and exclusive gang placement, for the run-to-completion baselines.

Unlike Gandiva_fair, the baselines give each running job its GPUs exclusively, so what matters
is how many GPUs each server has free. A job that fits one server of a generation goes to the
best-fitting server (fewest free GPUs that still fit: keeps whole servers free for big gangs); a
job larger than every server of the generation takes whole idle servers of it. Generations are
tried in the order the caller gives (fastest first for the job). Gangs never span generations.

Servers sit in buckets by free count (insertion-ordered dicts as ordered sets), so a placement
costs O(GPUs per server), not O(servers).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gfair.core.cluster import Cluster


@dataclass(frozen=True, slots=True)
class Holding:
    servers: tuple[str, ...]
    held: int  # GPUs held: the request on one server, every GPU of whole servers
    generation: str


class _Pool:
    def __init__(self, generation: str, sizes: dict[str, int]) -> None:
        self.generation = generation
        self.sizes = sizes
        self.largest = max(sizes.values())
        self.total = sum(sizes.values())
        self.by_free: list[dict[str, None]] = [{} for _ in range(self.largest + 1)]
        self.idle: dict[str, None] = {}
        for server, size in sizes.items():
            self.by_free[size][server] = None
            self.idle[server] = None


class Occupancy:
    def __init__(self, cluster: Cluster) -> None:
        self._pools: dict[str, _Pool] = {}
        self._pool_of: dict[str, _Pool] = {}
        self.free: dict[str, int] = {}
        for generation in cluster.generations:
            sizes = {server.id: server.gpus for server in cluster.by_generation(generation)}
            pool = _Pool(generation, sizes)
            self._pools[generation] = pool
            for server, size in sizes.items():
                self._pool_of[server] = pool
                self.free[server] = size
        self.free_total = cluster.total_gpus

    def held(self, generation: str, gpus: int) -> int | None:
        """GPUs a `gpus` gang holds on `generation`; None if it can never fit there."""
        pool = self._pools.get(generation)
        if pool is None or gpus > pool.total:
            return None
        if gpus <= pool.largest:
            return gpus
        # Whole servers, largest first: the fewest servers, and what `place` would take.
        held = 0
        for size in sorted(pool.sizes.values(), reverse=True):
            held += size
            if held >= gpus:
                break
        return held

    def place(self, gpus: int, generations: Iterable[str]) -> Holding | None:
        """Reserve GPUs for a gang on the first generation with room; None if none has."""
        for generation in generations:
            pool = self._pools.get(generation)
            if pool is None:
                continue
            servers = self._find(pool, gpus)
            if servers:
                placement = self._placement(pool, servers, gpus)
                self._reserve(placement)
                return placement
        return None

    def take(self, servers: Sequence[str], gpus: int) -> Holding | None:
        """Reserve exactly `servers` for a gang (to keep a job where it is) if they are free."""
        pool = self._pool_of[servers[0]]
        if len(servers) == 1:
            if self.free[servers[0]] < gpus:
                return None
        elif any(server not in pool.idle for server in servers):
            return None
        placement = self._placement(pool, tuple(servers), gpus)
        self._reserve(placement)
        return placement

    def release(self, placement: Holding) -> None:
        if len(placement.servers) == 1:
            self._move(placement.servers[0], placement.held)
        else:
            for server in placement.servers:
                self._move(server, self._pool_of[server].sizes[server])

    def _find(self, pool: _Pool, gpus: int) -> tuple[str, ...]:
        if gpus <= pool.largest:
            for free in range(gpus, pool.largest + 1):
                bucket = pool.by_free[free]
                if bucket:
                    return (next(iter(bucket)),)
            return ()
        if gpus > pool.total:
            return ()
        chosen: list[str] = []
        held = 0
        for server in sorted(pool.idle, key=lambda s: -pool.sizes[s]):
            chosen.append(server)
            held += pool.sizes[server]
            if held >= gpus:
                return tuple(chosen)
        return ()

    @staticmethod
    def _placement(pool: _Pool, servers: tuple[str, ...], gpus: int) -> Holding:
        held = gpus if len(servers) == 1 else sum(pool.sizes[s] for s in servers)
        return Holding(servers, held, pool.generation)

    def _reserve(self, placement: Holding) -> None:
        if len(placement.servers) == 1:
            self._move(placement.servers[0], -placement.held)
        else:
            for server in placement.servers:
                self._move(server, -self._pool_of[server].sizes[server])

    def _move(self, server: str, delta: int) -> None:
        pool = self._pool_of[server]
        before = self.free[server]
        after = before + delta
        if not 0 <= after <= pool.sizes[server]:
            raise ValueError(f"server {server}: {before} free GPUs cannot change by {delta}")
        del pool.by_free[before][server]
        pool.by_free[after][server] = None
        if before == pool.sizes[server]:
            del pool.idle[server]
        if after == pool.sizes[server]:
            pool.idle[server] = None
        self.free[server] = after
        self.free_total += delta


class RunningJobs:
    """Which job holds which placement, and the per-server view a `PolicyDecision` needs."""

    def __init__(self) -> None:
        self.placements: dict[str, Holding] = {}
        self.runs: dict[str, tuple[str, ...]] = {}

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.placements

    def __len__(self) -> int:
        return len(self.placements)

    def start(self, job_id: str, placement: Holding) -> None:
        if job_id in self.placements:
            raise ValueError(f"job {job_id} is already running")
        self.placements[job_id] = placement
        for server in placement.servers:
            self.runs[server] = (*self.runs.get(server, ()), job_id)

    def stop(self, job_id: str) -> Holding:
        placement = self.placements.pop(job_id)
        for server in placement.servers:
            remaining = tuple(other for other in self.runs[server] if other != job_id)
            if remaining:
                self.runs[server] = remaining
            else:
                del self.runs[server]
        return placement
