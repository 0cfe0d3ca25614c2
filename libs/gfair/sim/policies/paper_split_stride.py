"""The paper's split stride as a baseline (Gandiva_fair, EuroSys 2020; docs/design.md §2.3).

Jobs live on servers and time-slice there, as the paper describes, with
`gfair.sim.baselines.paper_split_stride.PerServerStride`:

- **Tickets.** A user's tickets are split equally among its active jobs, again as its jobs
  arrive and end.
- **Homes.** An arriving job is queued on a server with room for it if there is one, else on
  the server with the least ticket load per GPU among those that can hold it (the faster
  generation for its type on a tie); a gang larger than a server takes the least loaded whole
  servers of one generation (queued centrally).
- **A quantum.** Each server runs its own gang-aware stride over the jobs queued on it; the
  central stride decides the servers gangs spanning servers are placed on.
- **Load balancing** (moves, at most `budget` of the cluster's servers' worth a quantum). First
  idle GPUs: a server asked for fewer GPUs than it has takes one-server jobs that fit from the
  servers asked for most beyond theirs, of any generation; a gang spanning servers moves to
  whole servers nobody asked for, of a generation faster for it, or of its own when other jobs
  ask for its servers too. Then faster GPUs: GPUs nobody asked for take one-server jobs of
  slower generations that run faster there, the largest speed-up first (the paper places a
  job "on the fastest GPU subject to contention"). Then tickets: within each generation, while
  the most loaded server (tickets per GPU) is more than `threshold` of the generation's mean
  above the least loaded, one of its one-server jobs moves there, the one that evens the two
  most.

No trading and no profiling: a job's generation is where its home is: chosen when it arrives,
and changed only by the moves above. The kernel that gfair runs (`gfair.core.kernel`) is
measured against this in `gfair compare`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from gfair.core.cluster import Cluster, Server
from gfair.sim.baselines.paper_split_stride import PerServerStride
from gfair.sim.policy import EVERY_QUANTUM, Admission, PolicyDecision
from gfair.sim.speed import SpeedModel
from gfair.sim.trace import TraceJob

NAME = "paper-split-stride"


@dataclass(frozen=True)
class BalanceConfig:
    threshold: float = 0.25  # of the generation's mean load per GPU
    budget: float = 0.25  # moves per quantum, as a part of the cluster's servers (at least 1)


class PaperSplitStride:
    name = NAME

    def __init__(
        self,
        cluster: Cluster,
        speeds: SpeedModel,
        tickets: dict[str, float],
        default_tickets: float = 1.0,
        balance: BalanceConfig | None = None,
    ) -> None:
        self._cluster = cluster
        self._speeds = speeds
        self._tickets = tickets
        self._default_tickets = default_tickets
        self._balance = balance or BalanceConfig()
        self._stride = PerServerStride(cluster)
        self._by_generation: dict[str, list[Server]] = defaultdict(list)
        for server in cluster.servers:
            self._by_generation[server.generation].append(server)
        self._jobs: dict[str, TraceJob] = {}
        self._users: dict[str, list[str]] = defaultdict(list)  # user -> its active jobs

    def submit(self, job: TraceJob, now: float) -> Admission:
        servers = self._home(job)
        if servers is None:
            return Admission(False, f"{job.gpus} GPUs do not fit any generation of the cluster")
        self._jobs[job.id] = job
        self._users[job.user].append(job.id)
        self._stride.add(job.id, servers, job.gpus, self._share(job.user))
        self._retick(job.user)
        return Admission(True)

    def finish(self, job_id: str, now: float) -> None:
        job = self._jobs.pop(job_id)
        self._stride.remove(job_id)
        jobs = self._users[job.user]
        jobs.remove(job_id)
        if jobs:
            self._retick(job.user)
        else:
            del self._users[job.user]

    def observe(self, job_id: str, generation: str, rate: float, now: float) -> None:
        """The paper's stride is agnostic of speed; measurements change nothing here."""

    def plan(self, now: float) -> PolicyDecision:
        budget = max(1, int(len(self._cluster.servers) * self._balance.budget))
        budget -= self._fill_idle(budget)
        budget -= self._spread_gangs(budget)
        budget -= self._fill_faster(budget)
        for servers in self._by_generation.values():
            budget -= self._balance_generation(servers, budget)
        return PolicyDecision(runs=self._stride.schedule())

    def quiet_until(self, now: float) -> float:
        return EVERY_QUANTUM

    def homes(self) -> dict[str, tuple[str, ...]]:
        """Job id -> the servers it is queued on."""
        return dict(self._stride.placements())

    # -- homes and tickets --------------------------------------------------------------------

    def _share(self, user: str) -> float:
        tickets = self._tickets.get(user, self._default_tickets)
        return tickets / max(1, len(self._users[user]))

    def _retick(self, user: str) -> None:
        share = self._share(user)
        self._stride.set_many(dict.fromkeys(self._users[user], share))

    def _per_gpu(self, server: Server) -> float:
        return self._stride.loads()[server.id] / server.gpus

    def _home(self, job: TraceJob) -> tuple[str, ...] | None:
        """The least loaded servers that can hold the job (module doc), or None."""
        Choice = tuple[bool, float, int, tuple[str, ...]]
        best: Choice | None = None
        ranked = self._speeds.ranked(job.job_type, self._cluster.generations)
        for rank, generation in enumerate(ranked):
            servers = self._by_generation[generation]
            size = max(s.gpus for s in servers)
            if job.gpus <= size:
                full, load, server_id = min(
                    (self._full(s, job.gpus), self._per_gpu(s), s.id)
                    for s in servers
                    if s.gpus >= job.gpus
                )
                choice: Choice = (full, load, rank, (server_id,))
            else:
                whole = [s for s in servers if s.gpus == size]
                count = math.ceil(job.gpus / size)
                if count > len(whole):
                    continue
                taken = sorted(whole, key=lambda s: (self._per_gpu(s), s.id))[:count]
                load = sum(self._per_gpu(s) for s in taken) / count
                room = all(self._stride.asked()[s.id] == 0 for s in taken)
                choice = (not room, load, rank, tuple(s.id for s in taken))
            if best is None or choice < best:
                best = choice
        return None if best is None else best[3]

    def _full(self, server: Server, gpus: int) -> bool:
        """Whether the jobs queued on `server` leave fewer than `gpus` GPUs free."""
        return self._stride.asked()[server.id] + gpus > server.gpus

    # -- load balancing -----------------------------------------------------------------------

    def _fill_idle(self, budget: int) -> int:
        """Move one-server jobs onto servers asked for fewer GPUs than they have, from those
        asked for most beyond theirs; how many moved."""
        asked = self._stride.asked()
        moved = 0
        idle = sorted(
            (s for s in self._cluster.servers if asked[s.id] < s.gpus),
            key=lambda s: (asked[s.id] - s.gpus, s.id),
        )
        crowded = sorted(
            (s for s in self._cluster.servers if asked[s.id] > s.gpus),
            key=lambda s: (s.gpus - asked[s.id], s.id),
        )
        for target in idle:
            for source in crowded:
                while moved < budget and asked[source.id] > source.gpus:
                    free = target.gpus - asked[target.id]
                    fitting = [
                        j for j in self._stride.local_jobs(source.id) if self._jobs[j].gpus <= free
                    ]
                    if not fitting:
                        break
                    job_id = max(fitting, key=lambda j: (self._jobs[j].gpus, j))
                    self._stride.move(job_id, (target.id,), self._jobs[job_id].gpus)
                    moved += 1
                if moved == budget:
                    return moved
        return moved

    def _spread_gangs(self, budget: int) -> int:
        """Move gangs spanning servers onto whole servers nobody asks for: of a generation
        faster for them, else of their own when other jobs ask for theirs too; how many
        moved."""
        asked = self._stride.asked()
        moved = 0
        for job_id in sorted(self._stride.spanning()):
            if moved == budget:
                break
            servers = self._stride.placement(job_id)
            job = self._jobs[job_id]
            here = self._cluster.server(servers[0])
            shared = any(asked[s] > here.gpus for s in servers)
            speed = self._speeds.speed(job.job_type, here.generation)
            for generation in self._speeds.ranked(job.job_type, self._cluster.generations):
                faster = self._speeds.speed(job.job_type, generation) > speed
                if not faster and not (shared and generation == here.generation):
                    continue
                size = max(s.gpus for s in self._by_generation[generation])
                empty = [
                    s.id
                    for s in self._by_generation[generation]
                    if asked[s.id] == 0 and s.gpus == size
                ]
                count = math.ceil(job.gpus / size)
                if count > 1 and len(empty) >= count:
                    self._stride.move(job_id, empty[:count], job.gpus)
                    moved += 1
                    break
        return moved

    def _fill_faster(self, budget: int) -> int:
        """GPUs nobody asks for take one-server jobs from slower generations that run faster
        on them, the largest speed-up first; how many moved."""
        asked = self._stride.asked()
        moved = 0
        # Generation -> `_faster_on` it, looked for once until a move changes the homes.
        ranked: dict[str, list[tuple[float, str]]] = {}
        for target in self._cluster.servers:
            if target.gpus <= asked[target.id]:
                continue
            candidates = ranked.get(target.generation)
            if candidates is None:
                candidates = ranked[target.generation] = self._faster_on(target.generation)
            for _, job_id in candidates:
                if moved == budget:
                    return moved
                if self._jobs[job_id].gpus <= target.gpus - asked[target.id]:
                    self._stride.move(job_id, (target.id,), self._jobs[job_id].gpus)
                    moved += 1
                    ranked.clear()
        return moved

    def _faster_on(self, generation: str) -> list[tuple[float, str]]:
        """One-server jobs that run faster on `generation` than where they live, as
        (-speed-up, job id), the largest speed-up first."""
        faster: list[tuple[float, str]] = []
        for job_id, servers in self._stride.placements().items():
            if len(servers) > 1:
                continue
            job = self._jobs[job_id]
            here = self._cluster.server(servers[0]).generation
            gain = self._speeds.speed(job.job_type, generation) / self._speeds.speed(
                job.job_type, here
            )
            if gain > 1.0:
                faster.append((-gain, job_id))
        faster.sort()
        return faster

    def _balance_generation(self, servers: list[Server], budget: int) -> int:
        """Even out the tickets per GPU of `servers` (module doc); how many jobs moved."""
        for moved in range(budget):
            loads = {s.id: self._per_gpu(s) for s in servers}
            mean = sum(loads.values()) / len(loads)
            high = max(servers, key=lambda s: (loads[s.id], s.id))
            low = min(servers, key=lambda s: (loads[s.id], s.id))
            gap = loads[high.id] - loads[low.id]
            if mean <= 0 or gap <= self._balance.threshold * mean:
                return moved
            job_id = self._mover(high, low, gap)
            if job_id is None:
                return moved
            self._stride.move(job_id, (low.id,), self._jobs[job_id].gpus)
        return budget

    def _mover(self, high: Server, low: Server, gap: float) -> str | None:
        """The one-server job on `high` whose move to `low` leaves the two closest, if any
        leaves them closer than they are."""
        best: tuple[float, str] | None = None
        for job_id in self._stride.local_jobs(high.id):
            job = self._jobs[job_id]
            if job.gpus > low.gpus:
                continue
            tickets = self._stride.tickets(job_id)
            after = abs(gap - tickets / high.gpus - tickets / low.gpus)
            if after < gap and (best is None or (after, job_id) < best):
                best = (after, job_id)
        return None if best is None else best[1]
