"""Free GPUs of one pool's servers, and where a job of some GPUs goes among them.

Best fit for a job that fits on one server (the fullest server with room, so whole servers stay
free for gangs), whole idle servers, largest first, for a gang larger than any server. The
decision kernel packs its chosen jobs with it; the simulator's idle|fit measure
(`gfair.sim.idle_capacity`) packs the waiting jobs onto the idle GPUs with the same rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gfair.core.cluster import Server


class Packing:
    """Free GPUs of one pool's servers during a decision, with best-fit lookups."""

    __slots__ = ("buckets", "free", "largest", "order", "servers", "size", "total", "uniform")

    def __init__(self, servers: tuple[Server, ...], free: Mapping[str, int] | None = None) -> None:
        """`free`: GPUs free on each server (default: all of them)."""
        self.servers = servers
        self.size = {s.id: s.gpus for s in servers}
        self.order = {s.id: at for at, s in enumerate(servers)}
        self.free = dict(self.size) if free is None else {s.id: free[s.id] for s in servers}
        self.largest = max((s.gpus for s in servers), default=0)
        # Every server of the pool the same size (a generation's usually are): its idle
        # servers are then exactly the fullest bucket's, and no scan of them all is needed.
        self.uniform = all(s.gpus == self.largest for s in servers)
        self.total = sum(self.free.values())
        # buckets[f]: servers with exactly f free GPUs, as an insertion-ordered set.
        self.buckets: list[dict[str, None]] = [{} for _ in range(self.largest + 1)]
        for server in servers:
            self.buckets[self.free[server.id]][server.id] = None

    def release(self, servers: tuple[str, ...], gpus: int) -> None:
        for server_id, share in self._shares(servers, gpus):
            before = self.free[server_id]
            del self.buckets[before][server_id]
            self.free[server_id] = before + share
            self.buckets[before + share][server_id] = None
            self.total += share

    def take(self, server_id: str, gpus: int) -> None:
        """Take `gpus` of `server_id`, which has them free."""
        before = self.free[server_id]
        del self.buckets[before][server_id]
        self.free[server_id] = before - gpus
        self.buckets[before - gpus][server_id] = None
        self.total -= gpus

    def _shares(self, servers: tuple[str, ...], gpus: int) -> list[tuple[str, int]]:
        if len(servers) == 1:
            return [(servers[0], gpus)]
        return [(s, self.size[s]) for s in servers]  # a multi-server gang holds whole servers

    def fits(self, gpus: int) -> bool:
        if gpus > self.total:
            return False
        if gpus == 1:  # any free GPU will do (the common case, checked without a scan)
            return True
        if gpus <= self.largest:
            return any(self.buckets[gpus:])  # a server with that many free, at C speed
        idle = self.buckets[self.largest]
        if self.uniform:
            return len(idle) * self.largest >= gpus
        return sum(self.size[s] for s in idle) >= gpus or self._whole(gpus) is not None

    def _whole(self, gpus: int) -> tuple[str, ...] | None:
        if self.uniform and self.largest > 0:
            # The idle servers are the fullest bucket's: the first of them in server order.
            need = -(-gpus // self.largest)
            bucket = self.buckets[self.largest]
            if len(bucket) < need:
                return None
            return tuple(sorted(bucket, key=self.order.__getitem__)[:need])
        idle = [s for s in self.servers if self.free[s.id] == s.gpus]
        idle.sort(key=lambda s: -s.gpus)
        chosen: list[str] = []
        held = 0
        for server in idle:
            if held >= gpus:
                break
            chosen.append(server.id)
            held += server.gpus
        return tuple(chosen) if held >= gpus else None

    def place(self, gpus: int, prefer: Sequence[tuple[str, ...]]) -> tuple[str, ...] | None:
        """Servers for a job of `gpus`, taken; the first preferred placement that is free wins,
        else best fit (or whole idle servers for a gang larger than a server)."""
        free = self.free
        for servers in prefer:
            if len(servers) == 1:  # the common case, taken without the general helpers
                server_id = servers[0]
                before = free.get(server_id, 0)
                if before >= gpus:
                    buckets = self.buckets
                    del buckets[before][server_id]
                    free[server_id] = before - gpus
                    buckets[before - gpus][server_id] = None
                    self.total -= gpus
                    return servers
            elif servers and self.free_for(servers, gpus):
                self._take_whole(servers)
                return servers
        buckets = self.buckets
        if gpus <= self.largest:
            for f in range(gpus, self.largest + 1):
                bucket = buckets[f]
                if bucket:
                    server_id = next(iter(bucket))
                    del bucket[server_id]
                    free[server_id] = f - gpus
                    buckets[f - gpus][server_id] = None
                    self.total -= gpus
                    return (server_id,)
            return None
        whole = self._whole(gpus)
        if whole is not None:
            self._take_whole(whole)
        return whole

    def _take_whole(self, servers: tuple[str, ...]) -> None:
        """Take every GPU of `servers`, all idle (a gang larger than a server holds them)."""
        for server_id in servers:
            self.take(server_id, self.size[server_id])

    def free_for(self, servers: tuple[str, ...], gpus: int) -> bool:
        """Whether `servers` (one, or whole servers for a gang larger than one) hold `gpus` free."""
        if len(servers) == 1:
            return self.free.get(servers[0], 0) >= gpus
        free, size = self.free, self.size
        held = 0
        for server_id in servers:
            idle = free.get(server_id)
            if idle is None or idle != size[server_id]:
                return False
            held += idle
        return held >= gpus

    def copy(self) -> Packing:
        """The same free GPUs, to be taken and released independently of these."""
        twin = Packing.__new__(Packing)
        twin.servers = self.servers
        twin.size = self.size  # never written
        twin.order = self.order
        twin.uniform = self.uniform
        twin.free = dict(self.free)
        twin.largest = self.largest
        twin.total = self.total
        twin.buckets = [dict(bucket) for bucket in self.buckets]
        return twin
