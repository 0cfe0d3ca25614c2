"""Split stride: per-server gang-aware stride plus a central stride for multi-server jobs
(docs/design.md §2.3).

- A job that fits one server is queued on that server's local `GangStride`.
- A job spanning servers holds whole servers (of one generation) and is queued centrally. The
  central gang-aware stride sees the multi-server jobs plus one *aggregate* entry per contested
  server (a server some multi-server job is placed on): its tickets are the sum of its local
  jobs' tickets and its size is the server's GPUs. Entries are visited by (pass, join order);
  an entry runs when all the servers it needs are still unclaimed. A winning multi-server job
  holds its servers for the quantum and their local schedulers yield; an aggregate that wins
  lets its server schedule locally. Each winner pays ``GPUs held / tickets``.
- Servers no multi-server job is placed on are uncontested: they always schedule locally, and
  they cost nothing centrally (the central queue is only as large as the multi-server part of
  the workload). A server becoming contested joins the central queue at its minimum pass.

A multi-server job pays for the whole servers it holds (they are denied to everyone else for
the quantum), not only for the GPUs it asked.

State is plain data: `snapshot()` gives a JSON-able dict and `restore()` takes it back, so the
live service can keep passes in a key-value bucket.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from gfair.core.cluster import Cluster
from gfair.sim.baselines.gang import ENTRY_ORDER, GangStride
from gfair.sim.baselines.stride import StrideEntry, check_tickets, retick


class PerServerStride:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._local: dict[str, GangStride] = {s.id: GangStride(s.gpus) for s in cluster.servers}
        self._where: dict[str, tuple[str, ...]] = {}  # job id -> servers
        self._multi: dict[str, StrideEntry] = {}  # central entries of multi-server jobs
        self._aggregates: dict[str, StrideEntry] = {}  # central entries of contested servers
        # Server id -> multi-server jobs placed on it, in the order they came (a server's ticket
        # load sums their tickets: in a set's order, the sum's last bits changed with the hash
        # seed, and with them which of two equally loaded servers a job was given).
        self._multi_on: dict[str, dict[str, None]] = {}
        self._central_floor = 0.0
        self._central_seq = 0
        self._load: dict[str, float] = dict.fromkeys(self._local, 0.0)  # `server_tickets`
        self._asked: dict[str, int] = dict.fromkeys(self._local, 0)  # see `asked`
        # Servers with local jobs: a quantum visits only these (most of a large, lightly
        # loaded cluster is empty, and the empty ones have nothing to decide).
        self._occupied: dict[str, GangStride] = {}

    # -- queries ------------------------------------------------------------------------

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._where

    def __len__(self) -> int:
        return len(self._where)

    def placement(self, job_id: str) -> tuple[str, ...]:
        return self._where[job_id]

    def placements(self) -> Mapping[str, tuple[str, ...]]:
        return self._where

    def spanning(self) -> Collection[str]:
        """The jobs placed on several servers (the central stride's)."""
        return self._multi.keys()

    def local_jobs(self, server_id: str) -> tuple[str, ...]:
        return self._local[server_id].job_ids()

    def local_queue(self, server_id: str) -> GangStride:
        return self._local[server_id]

    def server_tickets(self, server_id: str) -> float:
        """Ticket load on a server: its local jobs' tickets plus, for each multi-server job
        placed on it, the job's tickets in proportion to the GPUs the server gives it."""
        total = self._local[server_id].tickets
        for job_id in self._multi_on.get(server_id, ()):
            entry = self._multi[job_id]
            total += entry.tickets * self._local[server_id].gpus / entry.gpus
        return total

    def loads(self) -> Mapping[str, float]:
        """Server id -> `server_tickets`, kept up to date as jobs come, go and change tickets."""
        return self._load

    def asked(self) -> Mapping[str, int]:
        """Server id -> GPUs its placed jobs ask (a multi-server job asks its whole servers)."""
        return self._asked

    def _update_load(self, servers: Iterable[str]) -> None:
        for server_id in servers:
            self._load[server_id] = self.server_tickets(server_id)
            queue = self._local[server_id]
            self._asked[server_id] = queue.demand + (
                queue.gpus * len(self._multi_on[server_id]) if server_id in self._multi_on else 0
            )
            if queue.demand:
                self._occupied[server_id] = queue
            else:
                self._occupied.pop(server_id, None)

    def tickets(self, job_id: str) -> float:
        return self._entry(job_id).tickets

    def pass_of(self, job_id: str) -> float:
        return self._entry(job_id).pass_

    def _entry(self, job_id: str) -> StrideEntry:
        servers = self._where[job_id]
        if job_id in self._multi:
            return self._multi[job_id]
        return self._local[servers[0]].entry(job_id)

    def _central_min_pass(self) -> float:
        passes = [e.pass_ for e in self._multi.values()]
        passes.extend(e.pass_ for e in self._aggregates.values())
        return min(passes, default=self._central_floor)

    # -- changes ------------------------------------------------------------------------

    def add(
        self, job_id: str, servers: Iterable[str], gpus: int, tickets: float, lag: float = 0.0
    ) -> None:
        """Queue `job_id` on `servers`: one server -> local queue, several -> central."""
        servers = tuple(servers)
        if job_id in self._where:
            raise ValueError(f"job {job_id} is already placed on {self._where[job_id]}")
        if not servers:
            raise ValueError(f"job {job_id}: no servers given")
        for server_id in servers:
            if server_id not in self._local:
                raise ValueError(f"job {job_id}: unknown server {server_id!r}")
        if len(set(servers)) != len(servers):
            raise ValueError(f"job {job_id}: a server is listed twice in {servers}")
        if len(servers) == 1:
            self._local[servers[0]].join(job_id, gpus, tickets, lag)
            self._where[job_id] = servers
            self._update_load(servers)
            return
        self._add_multi(job_id, servers, gpus, tickets, lag)

    def _add_multi(
        self, job_id: str, servers: tuple[str, ...], gpus: int, tickets: float, lag: float
    ) -> None:
        members = [self.cluster.server(s) for s in servers]
        if len({m.generation for m in members}) != 1:
            raise ValueError(f"job {job_id}: servers {servers} mix GPU generations")
        held = sum(m.gpus for m in members)
        if gpus > held:
            raise ValueError(f"job {job_id} asks {gpus} GPUs; servers {servers} have {held}")
        tickets = check_tickets(job_id, tickets)
        for server_id in servers:
            if server_id not in self._multi_on:
                self._multi_on[server_id] = {}
                self._aggregates[server_id] = StrideEntry(
                    server_id,
                    1.0,
                    self._central_min_pass(),
                    self._next_central_seq(),
                    self.cluster.server(server_id).gpus,
                )
            self._multi_on[server_id][job_id] = None
        self._multi[job_id] = StrideEntry(
            job_id,
            tickets,
            self._central_min_pass() + max(0.0, lag),
            self._next_central_seq(),
            held,
        )
        self._where[job_id] = servers
        self._update_load(servers)

    def _next_central_seq(self) -> int:
        self._central_seq += 1
        return self._central_seq - 1

    def remove(self, job_id: str) -> float:
        """Forget `job_id`; return its lag (pass above its queue's minimum)."""
        servers = self._where.pop(job_id)
        if job_id not in self._multi:
            lag = self._local[servers[0]].leave(job_id)
            self._update_load(servers)
            return lag
        floor = self._central_min_pass()
        entry = self._multi.pop(job_id)
        self._central_floor = max(self._central_floor, floor)
        for server_id in servers:
            jobs = self._multi_on[server_id]
            del jobs[job_id]
            if not jobs:
                del self._multi_on[server_id]
                del self._aggregates[server_id]
        self._update_load(servers)
        return entry.pass_ - floor

    def move(self, job_id: str, servers: Iterable[str], gpus: int) -> None:
        """Migrate `job_id`, keeping how far ahead of its queue's minimum it was."""
        tickets = self.tickets(job_id)
        lag = self.remove(job_id)
        self.add(job_id, servers, gpus, tickets, lag)

    def set_tickets(self, job_id: str, tickets: float) -> None:
        self.set_many({job_id: tickets})

    def set_many(self, tickets: Mapping[str, float]) -> None:
        """New tickets for several jobs: job id -> tickets (the same as one `set_tickets`
        each, but each queue's minimum pass and each server's load are worked out once)."""
        local: dict[str, dict[str, float]] = {}
        multi: dict[str, float] = {}
        touched: dict[str, None] = {}
        for job_id, value in tickets.items():
            servers = self._where[job_id]
            value = check_tickets(job_id, value)  # all checked before anything changes
            if job_id in self._multi:
                multi[job_id] = value
            else:
                local.setdefault(servers[0], {})[job_id] = value
            touched.update(dict.fromkeys(servers))
        for server_id, changes in local.items():
            self._local[server_id].set_many(changes)
        if multi:
            floor = self._central_min_pass()  # reticking keeps it where it is (see gang.py)
            for job_id, value in multi.items():
                retick(self._multi[job_id], value, floor)
        self._update_load(touched)

    # -- one quantum --------------------------------------------------------------------

    def schedule(self) -> dict[str, tuple[str, ...]]:
        """One quantum: server id -> jobs holding GPUs on it (busy servers only)."""
        runs: dict[str, tuple[str, ...]] = {}
        yielded: set[str] = set()
        if self._multi:
            yielded = self._schedule_central(runs)
        for server_id, queue in self._occupied.items():
            if server_id not in yielded:
                run = queue.schedule()
                if run:
                    runs[server_id] = run
        return runs

    def _schedule_central(self, runs: dict[str, tuple[str, ...]]) -> set[str]:
        """Decide the contested servers; return those whose local schedulers yield."""
        contenders = list(self._multi.values())
        for server_id, aggregate in self._aggregates.items():
            local_tickets = self._local[server_id].tickets
            if local_tickets > 0:
                aggregate.tickets = local_tickets
                contenders.append(aggregate)
        contenders.sort(key=ENTRY_ORDER)
        self._central_floor = max(self._central_floor, contenders[0].pass_)
        claimed: set[str] = set()
        yielded: set[str] = set()
        for entry in contenders:
            if entry.id in self._multi:
                servers = self._where[entry.id]
                if claimed.isdisjoint(servers):
                    claimed.update(servers)
                    yielded.update(servers)
                    for server_id in servers:
                        runs[server_id] = (entry.id,)
                    entry.pass_ += entry.gpus / entry.tickets
            elif entry.id not in claimed:
                claimed.add(entry.id)
                entry.pass_ += entry.gpus / entry.tickets
        return yielded

    # -- persistence --------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "servers": {sid: q.snapshot() for sid, q in self._local.items() if len(q)},
            "multi": [
                {**e.to_dict(), "servers": list(self._where[e.id])} for e in self._multi.values()
            ],
            "aggregates": [e.to_dict() for e in self._aggregates.values()],
            "central_floor": self._central_floor,
            "central_seq": self._central_seq,
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        """Replace all state with a `snapshot` taken on a cluster with the same servers."""
        local = {s.id: GangStride(s.gpus) for s in self.cluster.servers}
        where: dict[str, tuple[str, ...]] = {}
        for server_id, raw in data["servers"].items():
            if server_id not in local:
                raise ValueError(f"snapshot names unknown server {server_id!r}")
            local[server_id].restore(raw)
            for job_id in local[server_id].job_ids():
                where[job_id] = (server_id,)
        multi: dict[str, StrideEntry] = {}
        multi_on: dict[str, dict[str, None]] = {}
        for raw in data["multi"]:
            entry = StrideEntry.from_dict(raw)
            servers = tuple(str(s) for s in raw["servers"])
            for server_id in servers:
                if server_id not in local:
                    raise ValueError(f"snapshot names unknown server {server_id!r}")
                multi_on.setdefault(server_id, {})[entry.id] = None
            multi[entry.id] = entry
            where[entry.id] = servers
        aggregates = {e.id: e for e in map(StrideEntry.from_dict, data["aggregates"])}
        if set(aggregates) != set(multi_on):
            raise ValueError("snapshot's aggregate entries do not match its multi-server jobs")
        self._local, self._where, self._multi = local, where, multi
        self._aggregates, self._multi_on = aggregates, multi_on
        self._central_floor = float(data["central_floor"])
        self._central_seq = int(data["central_seq"])
        self._load = dict.fromkeys(self._local, 0.0)
        self._asked = dict.fromkeys(self._local, 0)
        self._occupied = {}
        self._update_load(self._local)
