"""The decision kernel: one quantum's runs, from a snapshot (docs/design.md §2.7).

`decide` is a pure function. It reads a `Snapshot` (pools and their servers, each active user's
entitlement and credit per pool, each runnable job with its speeds and where it ran) and returns
a `Decision` (which jobs run on which servers this quantum, and the GPUs each user was charged
per pool). The simulator's policy and the live services only build snapshots and carry
decisions out; `settle` then books the charges into the credits the next snapshot carries.

The rules, in order:

1. **Stride over users, per pool.** Every user holding share of a pool has an entry there whose
   priority is its *credit* normalised by its entitlement, ``(credit + E) / E`` (the stride
   pass, negated: credit grows by E each contended quantum and falls by the GPUs the user runs
   there). Entries are visited highest priority first, ties by the user's arrival order and
   then the fastest pool; a visited entry runs the user's next job (its jobs in order of their
   own passes, so a user's tickets are split equally among its jobs) that can run in the pool
   and fits, is charged its GPUs, and goes back in the heap with its lower priority. An entry
   whose user has no such job left leaves. This is gang-aware stride (docs/design.md §2.2):
   on one server it reproduces the slides' worked example exactly, and the highest-priority
   job always finds an empty pool, so big gangs never starve.
2. **Jobs are not tied to a pool.** A job may run on any generation its type fits, a different
   one each quantum, so a user's entitlement in every pool is usable even when it has fewer
   jobs than pools. But a job that ran, or whose checkpoint is on some servers, keeps to them
   (rule 8): a pool's turn runs first the user's jobs that start there without moving, then one
   its user is owed enough there to repay a move, then one whose own servers are free in
   another pool, run there on this pool's turn (charged where it runs while its user is owed
   there, else in the turn's pool, GPU for GPU: `_charge`). Among a user's chosen jobs of one
   size, those that ran in a pool the user runs in again keep their places there.
3. **Work conservation (surplus).** GPUs left after every entitled user ran what it could go to
   the waiting jobs, most-owed users first, each on the fastest pool where it fits: first the
   jobs that start without moving, then those whose servers are taken (whatever their move
   costs: waiting beside idle GPUs gains nothing). Surplus is not charged: it is capacity the
   pool's own users left.
4. **Fast GPUs first.** Idle GPUs of a faster pool take jobs from slower pools that run faster
   there (largest gain first), when the speed gained over the next quanta repays the move:
   nobody else wanted them this quantum. What such moves free in
   the slower pools goes through rule 3 again (a gang may now fit there).
5. **Where on the pool.** A job stays on the servers it ran on when they still have room, else
   returns to the servers holding its checkpoint, else goes best-fit (the fullest server with
   room, so whole servers stay free for gangs); a gang larger than a server takes whole idle
   servers. The selected set is packed again with that preference after selection; when the
   affinity packing cannot hold the set, the selection's own packing stands. A gang that does
   not fit because jobs that stay put leave every server partly free gets the server cheapest
   to clear: its jobs move to the others' free GPUs (`_fits`), rather than GPUs idle.
6. **Between quanta** (`backfill`): when a job ends or arrives mid-quantum, the GPUs left idle
   go to waiting jobs by rule 3 at once, the running jobs staying where they are; the next
   quantum's decision then starts from them as from any running job.
7. **When nobody waits**, every runnable job runs and the quantum is not booked (`settle`), so
   which pool each job runs in is free: the fastest pool goes to the jobs that gain most from
   it over the slower ones, then the next (`_fastest_to_fastest`), a job's speed in a pool
   other than its own weighed by what a move there leaves of the next quanta. Otherwise rule 1
   decides, and on a cluster with few fast GPUs the earliest users visited would hold them
   whether they gain 10x there or nothing.
8. **Moves only when they pay.** Every job carries its own switch costs (`RunnableJob.move_s`,
   `resume_s`; `gfair.core.switch_costs`) and the snapshot the quantum's length. A job that ran
   or has a checkpoint moves to other servers or another pool only when what it gains over the
   next quanta exceeds its move cost: a faster generation (`_HORIZON` quanta at the speed
   ratio, rules 4 and 7), GPUs that would otherwise idle (rule 3, always), or its user's
   share of a pool it cannot collect where it is: the user must be owed there, beyond what it
   is owed where the job lives, `gpus * c * min(_PATIENCE * c, _MOST_PATIENCE)` GPU-quanta for a
   move costing c of a quantum (`_owed_enough`), or, for a job whose own servers are taken,
   have saved up all `settle` lets it; but a user asking for no more GPUs than its share can
   never spend what it saves (it cannot run more than all its jobs), so its waiting job moves
   once its credit there covers the move, `gpus * c` (beyond what it is owed where the job
   lives): what waiting has lost it then equals what moving costs (ski rental). Cheap moves
   (Gandiva's 3 s of a 360 s quantum) are made about as soon as a user is owed a pool's share,
   dear ones (a minute or two) only once that share is worth many of them; and a job that moved
   for its share stays until its user is owed as much again elsewhere, so nothing bounces.

Jobs are visited within their user by (pass, arrival), as the snapshot lists them; at most
`_SCAN_LIMIT` of a user's jobs that do not fit are passed over per visit, so a quantum costs what
runs rather than what waits. A long queue's jobs are sorted by the pool they live in as the
decision reaches them, so that a visit in one pool passes over those living in the others without
looking at each (`_Queue`); the decision is the one a look at every job in order makes
(tests/core/test_kernel_paths.py). Charges are in GPU-quanta.
Nothing here reads a clock or draws a random number.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import operator
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from gfair.core.cluster import Server
from gfair.core.packing import Packing
from gfair.core.switch_costs import DEFAULT_COSTS

# The quantum's length unless the operator sets one: what every driver and the kernel default to.
DEFAULT_QUANTUM_S: Final = 60.0

_EPS = 1e-9
# Jobs of one user that a visit may skip (do not fit the pool) before the entry gives up for
# this quantum: bounds a visit's cost when a user has thousands of queued jobs.
_SCAN_LIMIT = 64
# Users with more jobs than this have them sorted by the pool they live in as a decision looks
# at them, so that a visit in one pool does not look at each job living in another.
_SHORT_QUEUE = 16
# Times per pool and quantum the chosen jobs may be packed again to make room for a gang, and
# the most chosen jobs a pool may have for it (each repack places them all again).
_REPACKS = 2
_REPACK_JOBS = 512
# Quanta over which a move's gain is counted against its cost (rule 8): a job moved to a faster
# pool runs there for at least the quantum it moved in, and usually the next ones too.
_HORIZON = 2.0
# How many times a move's cost its user must be owed in the pool it would move to, for its
# share there to repay the move (rule 8): `_PATIENCE` times the move's cost as a part of a
# quantum, at most `_MOST_PATIENCE`. A move displaces a job that lives there, and a dear one is
# not undone cheaply, so the dearer a move the more times over it must be repaid. Tuned on the
# comparison workloads (docs/benchmarks.md): 3 s of 360 s moves as soon as owed, 60 s moves
# only for 3.3 GPU-quanta owed (more than a one-job user on a busy cluster ever saves up).
_PATIENCE = 120.0
_MOST_PATIENCE = 20.0
# Keys the kernel sorts and looks up by, at C speed (a decision applies them to every job).
_ID = operator.attrgetter("id")
_WHERE_RUNNING = operator.attrgetter("running", "id")
_USER = operator.attrgetter("job.user")
_ARRIVAL = operator.attrgetter("job.seq")
_SIZE = operator.attrgetter("job.gpus")
_TOTAL = operator.attrgetter("total")
_USER_SIZE = operator.attrgetter("job.user", "job.gpus")
_SPEEDS = operator.attrgetter("job.speeds")


@dataclass(slots=True)
class RunnableJob:
    """A runnable job as the kernel sees it. Drivers own these records; `decide` reads them."""

    id: str
    user: str
    gpus: int
    seq: int  # arrival order, the last tie-break
    speeds: dict[str, float]  # generation -> relative speed; 0: its type does not fit there
    pass_: float = 0.0  # GPU-quanta received while contended / weight, from the user's minimum
    weight: float = 1.0  # its part of its user's share, relative to the user's other jobs
    running: tuple[str, ...] = ()  # servers it held last quantum
    home: tuple[str, ...] = ()  # servers holding its latest checkpoint
    # Seconds of progress it loses starting on other servers than `running`/`home` (a move),
    # and resuming on `home` after a suspend (gfair.core.switch_costs)
    move_s: float = DEFAULT_COSTS.migration_s
    resume_s: float = DEFAULT_COSTS.resume_s


@dataclass(slots=True)
class UserState:
    name: str
    seq: int  # arrival order of the user (ties between equal priorities)
    entitled: dict[str, float] = field(default_factory=dict)  # pool -> GPUs of share
    credit: dict[str, float] = field(default_factory=dict)  # pool -> GPU-quanta owed


@dataclass(frozen=True, slots=True)
class PoolState:
    generation: str
    servers: tuple[Server, ...]
    speed_rank: int  # 0 for the fastest pool


@dataclass(frozen=True, slots=True)
class Snapshot:
    pools: Sequence[PoolState]  # fastest first
    users: Mapping[str, UserState]
    # user -> its runnable jobs in the order its share goes to them: by pass, then arrival
    # (drivers keep them sorted, so a quantum costs what runs, not what waits)
    jobs: Mapping[str, Sequence[RunnableJob]]
    # user -> pool -> GPU-quanta its jobs held beyond what earlier decisions gave them (a job
    # told to stop that went on holding its GPUs until its node reported it off), for `settle`
    # to charge; the simulator's jobs stop when told, so it has none
    overrun: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # user -> pool -> GPU-quanta the last booked decision charged it for that its jobs did not
    # hold: a job it ran started late (the GPUs' last holder was still yielding, or its node
    # took time to launch it), for `settle` to give back; the simulator's jobs start when
    # told, so it has none
    unheld: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # The quantum's length: what a move's seconds are weighed against (rule 8)
    quantum_s: float = DEFAULT_QUANTUM_S


@dataclass(frozen=True, slots=True)
class Decision:
    runs: dict[str, tuple[str, ...]]  # server id -> jobs holding GPUs on it this quantum
    placed: dict[str, tuple[str, ...]]  # job id -> servers, for every job that runs
    charged: dict[str, dict[str, float]]  # user -> pool -> GPUs run on its entitlement
    waiting: int  # runnable jobs that do not run this quantum
    # pool -> GPUs no job holds this quantum: none of the waiting jobs fits them (the decision
    # is work-conserving), so they are owed to nobody (`settle`)
    idle: dict[str, int] = field(default_factory=dict)
    served: frozenset[str] = frozenset()  # users with a job running this quantum
    entitled: frozenset[str] = frozenset()  # jobs run on their users' entitlement (charged)


@dataclass(slots=True)
class _Choice:
    job: RunnableJob
    pool: str
    servers: tuple[str, ...]


# Stands for every running job `backfill` leaves where it is (only whether one is chosen is read).
_RUNNING = _Choice(RunnableJob("", "", 0, 0, {}), "", ())


# What a decision derives from its pools alone, kept for the pools decided last (by identity,
# holding them so that no other object takes their ids): drivers pass the same pools, immutable,
# quantum after quantum, and a decision packs each pool several times.
_EMPTY: dict[int, tuple[PoolState, Packing]] = {}
_SERVERS: dict[tuple[int, ...], tuple[tuple[PoolState, ...], _ServerPools]] = {}
_KEPT = 64  # layouts kept at most: a driver whose pools change each quantum still gets them right


@dataclass(frozen=True, slots=True)
class _ServerPools:
    """Server id -> its pool: as the pool's index (fastest first), generation and state; and
    its GPUs."""

    rank: dict[str, int]
    generation: dict[str, str]
    state: dict[str, PoolState]
    size: dict[str, int]


def _empty(pool: PoolState) -> Packing:
    """A packing of the pool with every GPU free."""
    kept = _EMPTY.get(id(pool))
    if kept is None or kept[0] is not pool:
        if len(_EMPTY) >= _KEPT:
            _EMPTY.clear()
        kept = _EMPTY[id(pool)] = (pool, Packing(pool.servers))
    return kept[1].copy()


def _server_pools(pools: Sequence[PoolState]) -> _ServerPools:
    key = tuple(map(id, pools))
    kept = _SERVERS.get(key)
    if kept is None or any(a is not b for a, b in zip(kept[0], pools, strict=True)):
        if len(_SERVERS) >= _KEPT:
            _SERVERS.clear()
        maps = _ServerPools(
            {server.id: rank for rank, pool in enumerate(pools) for server in pool.servers},
            {server.id: pool.generation for pool in pools for server in pool.servers},
            {server.id: pool for pool in pools for server in pool.servers},
            {server.id: server.gpus for pool in pools for server in pool.servers},
        )
        kept = _SERVERS[key] = (tuple(pools), maps)
    return kept[1]


def decide(snapshot: Snapshot) -> Decision:
    """One quantum's decision (module doc)."""
    pools = list(snapshot.pools)
    packing = {p.generation: _empty(p) for p in pools}
    chosen: dict[str, _Choice] = {}
    order = {user: jobs for user, jobs in snapshot.jobs.items() if jobs}
    charged = _entitled_runs(snapshot, pools, packing, order, chosen)
    entitled = frozenset(chosen)
    _surplus_runs(snapshot, pools, packing, order, chosen, charged)
    _keep_pools(pools, chosen)
    if _fast_first(
        pools, packing, chosen, snapshot.quantum_s
    ):  # moves may have freed room a gang can use
        _surplus_runs(snapshot, pools, packing, order, chosen, charged)
    _affinity(pools, packing, chosen)
    _surplus_runs(snapshot, pools, packing, order, chosen, charged)  # what packing freed
    waiting = sum(len(jobs) for jobs in order.values()) - len(chosen)
    if waiting == 0:
        _fastest_to_fastest(pools, packing, chosen, snapshot.quantum_s)
    placed = {job_id: choice.servers for job_id, choice in chosen.items()}
    runs: defaultdict[str, list[str]] = defaultdict(list)
    for job_id, servers in placed.items():
        for server_id in servers:
            runs[server_id].append(job_id)
    return Decision(
        runs={s: tuple(jobs) for s, jobs in runs.items()},
        placed=placed,
        charged=charged,
        waiting=waiting,
        idle={generation: free.total for generation, free in packing.items() if free.total},
        served=frozenset(map(_USER, chosen.values())),
        entitled=entitled,
    )


def backfill(snapshot: Snapshot, holding: Iterable[RunnableJob]) -> dict[str, tuple[str, ...]]:
    """Between decisions (a job ended, or arrived, mid-quantum): the GPUs that `holding` (the
    jobs running, on their `running` servers) leave idle go to waiting jobs by rule 3, so no
    GPU idles until the next quantum while a job that fits waits. Running jobs stay where they
    are; nothing is charged (as for any surplus). Returns the placements of the jobs that start.
    """
    pools = list(snapshot.pools)
    holding = list(holding)
    held = _held_in_place(pools, holding)
    if held is None:
        packing, chosen = _held_in_order(pools, holding)
    else:
        packing, running_ids = held
        # Running jobs keep their servers, and `_surplus_runs` without repacks only asks
        # whether a job is chosen: one placeholder stands for all of them.
        chosen = dict.fromkeys(running_ids, _RUNNING)
    running = set(chosen)
    order = {user: jobs for user, jobs in snapshot.jobs.items() if jobs}
    _surplus_runs(snapshot, pools, packing, order, chosen, {}, repack=False)
    return {job_id: c.servers for job_id, c in chosen.items() if job_id not in running}


def _held_in_order(
    pools: list[PoolState], holding: list[RunnableJob]
) -> tuple[dict[str, Packing], dict[str, _Choice]]:
    """The pools' free GPUs once `holding` is placed on its servers one job at a time, and
    the jobs placed. In an order of the kernel's own: best fit picks among equally free servers
    by the order they became so, and the drivers hold their running jobs in orders of their
    own. A job whose servers are taken is placed elsewhere, as any."""
    packing = {p.generation: _empty(p) for p in pools}
    pool_of = _server_pools(pools).generation
    chosen: dict[str, _Choice] = {}
    for job in sorted(holding, key=_WHERE_RUNNING):
        pool = pool_of.get(job.running[0]) if job.running else None
        if pool is None:
            continue
        servers = packing[pool].place(job.gpus, (job.running,))
        if servers is not None:
            chosen[job.id] = _Choice(job, pool, servers)
    return packing, chosen


def _held_in_place(
    pools: list[PoolState], holding: list[RunnableJob]
) -> tuple[dict[str, Packing], list[str]] | None:
    """What `_held_in_order` gives, without sorting and placing every running job, when every
    job fits where it runs (a consistent cluster: the drivers never start a job on GPUs still
    held): the GPUs taken on each server, and each server's place among equally free ones
    from the last job, in that order, to take its GPUs. None when some job does not fit where
    it runs (`_held_in_order` then says where it goes)."""
    server_pools = _server_pools(pools)
    pool_of, size = server_pools.generation, server_pools.size
    taken: dict[str, int] = {}
    gangs: dict[str, tuple[str, ...]] = {}  # server -> the gang holding it whole
    placed: list[str] = []
    for job in holding:
        running = job.running
        if not running:
            continue
        pool = pool_of.get(running[0])
        if pool is None:
            continue
        if len(running) == 1:
            server = running[0]
            if server in gangs:
                return None
            now = taken.get(server, 0) + job.gpus
            if now > size[server]:
                return None
            taken[server] = now
        else:
            for server in running:
                if pool_of.get(server) != pool or server in taken:
                    return None
                taken[server] = size[server]
                gangs[server] = running
            if sum(map(size.__getitem__, running)) < job.gpus:
                return None
        placed.append(job.id)

    def last_taken(server: str) -> tuple[tuple[str, ...], int]:
        # `_held_in_order` places by (servers, id): a server is last taken by its own jobs, or
        # by the gang holding it, whose servers are taken in their order.
        gang = gangs.get(server)
        return (gang, gang.index(server)) if gang is not None else ((server,), 0)

    packing = {p.generation: _empty(p) for p in pools}
    for server in sorted(taken, key=last_taken):
        packing[pool_of[server]].take(server, taken[server])
    return packing, placed


def _prefer(job: RunnableJob) -> tuple[tuple[str, ...], ...]:
    # Servers of another pool are simply not free in this one.
    return (job.running, job.home)


class _Queue:
    """A user's jobs during `_entitled_runs`: how far they are all chosen, and, for the jobs
    looked at so far, which start in a pool without moving, by pool, so that a visit in a pool
    passes over the jobs living in the others without looking at each."""

    __slots__ = (
        "anywhere",
        "at_anywhere",
        "at_own",
        "classified",
        "jobs",
        "marks",
        "own",
        "spent",
        "start",
        "state",
    )
    classified: int
    anywhere: list[int]
    own: list[list[int]]
    at_anywhere: list[int]
    at_own: list[int]

    def __init__(
        self, jobs: Sequence[RunnableJob], pools: int, state: UserState, spent: dict[str, float]
    ) -> None:
        self.jobs = jobs
        self.state = state
        self.spent = spent  # what the user was charged so far, per pool
        self.start = 0  # jobs before this index are all chosen
        # Where the visits' looks stopped: per pool, for jobs that start there without moving,
        # then for those that move there or run elsewhere on its turn (`_next_move`)
        self.marks = [0] * (2 * pools)
        # A long queue's jobs before `classified`: those that never ran nor left a checkpoint
        # in a pool, and those whose servers are in each pool; where the first cursor stands
        # in `anywhere` and in `own` of each pool. A short queue is looked through job by job
        # (most users' are: these are left unset).
        if len(jobs) > _SHORT_QUEUE:
            self.classified = 0
            self.anywhere = []
            self.own = [[] for _ in range(pools)]
            self.at_anywhere = [0] * pools
            self.at_own = [0] * pools

    def classify(self, end: int, pool_of: Mapping[str, int]) -> None:
        jobs, own, anywhere = self.jobs, self.own, self.anywhere
        for index in range(self.classified, end):
            job = jobs[index]
            servers = job.running or job.home
            lives = pool_of.get(servers[0]) if servers else None
            if lives is None:
                anywhere.append(index)
            else:
                own[lives].append(index)
        self.classified = end


def _start_in_place(
    queue: _Queue,
    rank: int,
    at: int,
    end: int,
    generation: str,
    room: Packing,
    chosen: Mapping[str, object],
    fits: Sequence[Callable[[int], bool]],
    pool_of: Mapping[str, int],
) -> tuple[RunnableJob | None, int]:
    """A visit's first look in a long queue: the first of the user's jobs from `at` on,
    before `end`, that starts in pool `rank` without moving, and where the look stopped (at
    that job, else at `end`). Only the jobs that never ran and those living in the pool can:
    the two lists of them are walked together, in queue order."""
    if queue.classified < end:
        # a window ahead at once: the look moves on a job or two per visit
        queue.classify(min(len(queue.jobs), end + _SCAN_LIMIT), pool_of)
    jobs = queue.jobs
    anywhere, own = queue.anywhere, queue.own[rank]
    first, second = queue.at_anywhere[rank], queue.at_own[rank]
    fresh_end, kept_end = len(anywhere), len(own)
    while first < fresh_end and anywhere[first] < at:
        first += 1
    while second < kept_end and own[second] < at:
        second += 1
    job: RunnableJob | None = None
    free = room.free
    while True:
        fresh = anywhere[first] if first < fresh_end else end
        kept = own[second] if second < kept_end else end
        if fresh < kept and fresh < end:
            candidate = jobs[fresh]
            # A one-GPU job fits any pool with a free GPU (`Packing.fits`).
            if (
                candidate.id not in chosen
                and candidate.speeds.get(generation, 0.0) > 0
                and (candidate.gpus == 1 or fits[rank](candidate.gpus))
            ):
                job, at = candidate, fresh
                break
            first += 1
        elif kept < end:
            candidate = jobs[kept]
            if candidate.id not in chosen and candidate.speeds.get(generation, 0.0) > 0:
                servers = candidate.running or candidate.home
                if (
                    free.get(servers[0], 0) >= candidate.gpus  # `Packing.free_for`, one server
                    if len(servers) == 1
                    else room.free_for(servers, candidate.gpus)
                ):
                    job, at = candidate, kept
                    break
            second += 1
        else:
            at = end
            break
    queue.at_anywhere[rank], queue.at_own[rank] = first, second
    return job, at


def _entitled_runs(
    snapshot: Snapshot,
    pools: list[PoolState],
    packing: dict[str, Packing],
    order: Mapping[str, Sequence[RunnableJob]],
    chosen: dict[str, _Choice],
) -> dict[str, dict[str, float]]:
    """Rule 1: the per-pool stride over users' entitlements."""
    users = snapshot.users
    heap: list[tuple[float, int, int, str]] = []
    ranked = [(pool.generation, pool.speed_rank) for pool in pools]
    for user in order:
        state = users[user]
        shares, credits, seq = state.entitled, state.credit, state.seq
        for generation, speed_rank in ranked:
            entitled = shares.get(generation, 0.0)
            if entitled > _EPS:
                # `_priority`, inline: this loop runs for every user and pool each quantum
                priority = round((credits.get(generation, 0.0) + entitled) / entitled, 9)
                heap.append((-priority, seq, speed_rank, user))
    heapq.heapify(heap)
    pool_of = _server_pools(pools).rank
    generations = [pool.generation for pool in pools]
    npools = len(pools)
    queues: dict[str, _Queue] = {}
    charged: dict[str, dict[str, float]] = {}
    full = [False] * npools  # by rank: found without a free GPU
    done: set[str] = set()  # users all of whose jobs run
    open_pools = npools
    repacks = dict.fromkeys(packing, _REPACKS)
    fits = [
        functools.partial(_fits, pool, packing=packing, chosen=chosen, repacks=repacks)
        for pool in pools
    ]
    quantum_s = snapshot.quantum_s
    heappop, heappushpop = heapq.heappop, heapq.heappushpop
    # The entry a visit put back: pushed and the next one popped in one step, the same entry
    # again when it still comes first.
    back: tuple[float, int, int, str] | None = None
    while open_pools:
        if back is not None:
            _, seq, rank, user = heappushpop(heap, back)
            back = None
        elif heap:
            _, seq, rank, user = heappop(heap)
        else:
            break
        if full[rank] or user in done:
            continue
        generation = generations[rank]
        room = packing[generation]
        if room.total == 0:
            full[rank] = True
            open_pools -= 1
            continue
        queue = queues.get(user)
        if queue is None:
            spent = charged[user] = {}
            queue = queues[user] = _Queue(order[user], npools, users[user], spent)
        jobs, state, spent = queue.jobs, queue.state, queue.spent
        # The job the visit runs, and the pool it runs in (rule 8): of the user's jobs in
        # order (at most `_SCAN_LIMIT`), the first that runs here without moving, where nearly
        # every visit ends: one that never ran, or one whose servers (where it ran, else its
        # checkpoint's) are here and free. Failing that, one that moves here or runs
        # elsewhere on this pool's turn (`_next_move`).
        count = len(jobs)
        index = queue.start
        while index < count and jobs[index].id in chosen:
            index += 1
        queue.start = index
        if index == count:
            done.add(user)  # every job of the user runs: its entries leave
            continue
        end = index + _SCAN_LIMIT if index + _SCAN_LIMIT < count else count
        # Jobs before the cursor were found not to start here without moving earlier in this
        # decision, and GPUs are only taken as it goes: they are not looked at again for that.
        marks = queue.marks
        at = marks[rank] if marks[rank] > index else index
        job: RunnableJob | None = None
        if count <= _SHORT_QUEUE:
            while at < end:
                candidate = jobs[at]
                if candidate.id not in chosen and candidate.speeds.get(generation, 0.0) > 0:
                    own = candidate.running or candidate.home
                    lives = pool_of.get(own[0]) if own else None
                    if lives is None:
                        # A one-GPU job fits any pool with a free GPU (`Packing.fits`).
                        if candidate.gpus == 1 or fits[rank](candidate.gpus):
                            job = candidate
                            break
                    elif lives == rank and room.free_for(own, candidate.gpus):
                        job = candidate
                        break
                at += 1
        else:
            job, at = _start_in_place(queue, rank, at, end, generation, room, chosen, fits, pool_of)
        marks[rank] = at
        where = generation
        if job is None:
            run = _next_move(
                jobs,
                index,
                end,
                rank,
                pools,
                packing,
                pool_of,
                fits,
                chosen,
                state,
                spent,
                quantum_s,
                marks,
            )
            if run is None:
                continue
            job, where = run
        servers = packing[where].place(job.gpus, (job.running, job.home))
        assert servers is not None  # the fit was checked
        chosen[job.id] = _Choice(job, where, servers)
        if where == generation:
            paid = generation
        else:
            paid = _charge(job, state, spent, generation, where)[0]
        spent[paid] = spent.get(paid, 0.0) + float(job.gpus)
        entitled = state.entitled[generation]
        credit = state.credit.get(generation, 0.0) - spent.get(generation, 0.0)
        back = (-round((credit + entitled) / entitled, 9), seq, rank, user)  # `_priority`
    return charged


def _charge(
    job: RunnableJob, state: UserState, spent: Mapping[str, float], turn: str, where: str
) -> tuple[str, float]:
    """The pool a job run on the turn of its user's entry in `turn` is charged in, and how
    many GPU-quanta: its GPUs where it runs, while its user is still owed there (credit left
    after what it was charged so far this quantum); else the turn's pool, at the job's own
    speed ratio between the two, so that its user's share there buys it the work it would
    have done there, no more and no less.

    Without it, a user whose share is split among pools runs its job wherever its credit is
    highest, and running there makes another pool's higher next quantum: the job moved every
    quantum (a checkpoint and restore each time), and live, each move waits for its old node
    to confirm the stop and its new one to clear the GPUs, so an owed user spent its quanta
    moving instead of running. Charged where it runs while owed there, and in the turn's pool
    after that, it runs where it is and its user's share of every pool still reaches it."""
    if where == turn:
        return turn, float(job.gpus)
    if (
        state.entitled.get(where, 0.0) > _EPS
        and state.credit.get(where, 0.0) - spent.get(where, 0.0) > _EPS
    ):
        return where, float(job.gpus)
    return turn, float(job.gpus)


def _own(job: RunnableJob) -> tuple[str, ...]:
    """The servers the job starts on without moving: where it ran, else its checkpoint's."""
    return job.running or job.home


def _switch_s(job: RunnableJob, servers: tuple[str, ...]) -> float:
    """Seconds of progress the job loses running on `servers` this quantum."""
    if job.running:
        return 0.0 if servers == job.running else job.move_s
    if job.home:
        return job.resume_s if servers == job.home else job.move_s
    return 0.0  # a first start: its start-up is part of its run time


def _pays(gain_s: float, cost_s: float) -> bool:
    """Rule 8: a move is made when what it gains, in seconds of the job's progress over the
    next quanta, exceeds the seconds it loses moving."""
    return gain_s > cost_s + _EPS


def _next_move(
    jobs: Sequence[RunnableJob],
    index: int,
    end: int,
    rank: int,
    pools: Sequence[PoolState],
    packing: Mapping[str, Packing],
    pool_of: Mapping[str, int],
    fits: Sequence[Callable[[int], bool]],
    chosen: Mapping[str, object],
    state: UserState,
    spent: Mapping[str, float],
    quantum_s: float,
    marks: list[int],
) -> tuple[RunnableJob, str] | None:
    """The job the user's entry in pool `rank` runs when none of its jobs (from `index`, before
    `end`) starts there without moving, and the pool it runs in (rule 8).

    The first that moves here because its user is owed enough here for the move to pay
    (`_owed_enough`: from another pool, or from its own servers here, taken). Failing that, the
    first whose servers are free in another pool runs there, on this pool's turn. A job that
    would have to move and for which it does not pay waits for its servers (`_surplus_runs`
    gives it GPUs nobody else takes). `marks[len(pools) + rank]` is where the last look of the
    kind stopped."""
    pool = pools[rank]
    generation = pool.generation
    room = packing[generation]
    owed: dict[tuple[int, float, str, bool], bool] = {}  # the same for most of a user's jobs
    saves: bool | None = None  # `_saves`, once a job waits
    # What the user is owed here and the GPUs free elsewhere only fall as the decision goes
    # on: jobs before the cursor are not looked at again.
    key = len(pools) + rank
    for at in range(max(index, marks[key]), end):
        job = jobs[at]
        own = job.running or job.home
        lives = pool_of.get(own[0]) if own else None
        if lives is None or job.id in chosen:
            continue
        here = job.speeds.get(generation, 0.0)
        home = pools[lives]
        there = job.speeds.get(home.generation, 0.0)
        free = there > 0 and packing[home.generation].free_for(own, job.gpus)
        if here > 0 and room.total >= job.gpus:
            case = (job.gpus, job.move_s, home.generation, free)
            enough = owed.get(case)
            if enough is None:
                if not free and saves is None:
                    saves = _saves(jobs, state)
                enough = owed[case] = _owed_enough(
                    job,
                    state,
                    spent,
                    generation,
                    home.generation,
                    quantum_s,
                    waits=not free,
                    saves=bool(saves),
                )
            if enough and fits[rank](job.gpus):
                marks[key] = at
                return job, generation
        if free and here > 0 and home.generation != generation:
            marks[key] = at
            return job, home.generation
    marks[key] = end
    return None


def _owed_enough(
    job: RunnableJob,
    state: UserState,
    spent: Mapping[str, float],
    generation: str,
    lives: str,
    quantum_s: float,
    *,
    waits: bool,
    saves: bool,
) -> bool:
    """Whether the job's user is owed enough in `generation` for a move there to pay: its
    credit there, in GPU-seconds, exceeds `_PATIENCE` times what moving costs the job; or, for
    a job that `waits` (its own servers are taken), it has saved up all it may there
    (`settle`'s ceiling, at least), so that waiting longer would lose its share there; or, for
    a waiting job whose user `saves` nothing (`_saves`: what it is owed is lost, not put by),
    its credit there covers the move's cost (beyond what it is owed where it lives), so that it
    has lost to waiting what moving costs.
    Cheap moves are made as soon as a user is owed a pool's share, as if jobs were free to move;
    dear ones only once the share they collect is worth them, and a job that moved stays until
    its user is owed as much again elsewhere, so it does not bounce."""
    entitled = state.entitled.get(generation, 0.0)
    credit = state.credit.get(generation, 0.0) - spent.get(generation, 0.0)
    cost = job.move_s / quantum_s  # of a quantum's progress
    needed = job.gpus * cost * min(_PATIENCE * cost, _MOST_PATIENCE)
    # Owed as much where it lives, it is as well off running there.
    at_home = 0.0 if generation == lives else state.credit.get(lives, 0.0) - spent.get(lives, 0.0)
    needed += max(0.0, at_home)
    if waits:
        needed = min(needed, max(float(job.gpus), entitled * _CREDIT_QUANTA))
        if not saves:
            needed = min(needed, job.gpus * cost + max(0.0, at_home))
    return credit > _EPS and credit >= needed - _EPS


def _saves(jobs: Sequence[RunnableJob], state: UserState) -> bool:
    """Whether the user's jobs ask for more GPUs than its share: only then can it spend later
    (running beyond its share while others' jobs wait) the credit it is owed while a job of it
    waits. Otherwise that credit is share lost: its jobs cannot run on more than they ask."""
    share = sum(state.entitled.values())
    asked = 0
    for job in jobs:
        asked += job.gpus
        if asked > share + _EPS:
            return True
    return False


def _faster(
    job: RunnableJob, here: float, there: float, own: tuple[str, ...], quantum_s: float
) -> bool:
    """Whether running at speed `here` instead of `there` (where it ran) gains the job more
    over the next quanta than moving costs it beyond starting on `own`."""
    gain = (here / there - 1) * quantum_s * _HORIZON if there > 0 else math.inf
    return _pays(gain, job.move_s - _switch_s(job, own))


def _priority(credit: float, entitled: float) -> float:
    # Rounded so that equal passes reached by different sums of fractions tie exactly, and the
    # tie-break (arrival order) decides, as in integer stride.
    return round((credit + entitled) / entitled, 9)


def _fits(
    pool: PoolState,
    gpus: int,
    packing: dict[str, Packing],
    chosen: Mapping[str, _Choice],
    repacks: dict[str, int],
) -> bool:
    """Whether a job of `gpus` fits the pool now, packing the pool's chosen jobs again,
    largest first, when the free GPUs suffice but are scattered (at most `_REPACKS` times per
    pool and quantum, and only in pools running at most `_REPACK_JOBS` jobs, to bound a
    quantum's cost): greedy packing in priority order leaves holes a gang cannot use. The
    chosen jobs keep their servers where that leaves room; where it does not (jobs that ran
    spread over several servers each hold part of one), the jobs of the server that is
    cheapest to clear move to the others' free GPUs, rather than the scattered GPUs idle."""
    room = packing[pool.generation]
    if room.fits(gpus):
        return True
    if room.total < gpus or repacks[pool.generation] <= 0:
        return False
    repacks[pool.generation] -= 1
    members = [c for c in chosen.values() if c.pool == pool.generation]
    if len(members) > _REPACK_JOBS:
        return False
    members.sort(key=lambda c: (-c.job.gpus, not c.job.running, c.job.seq))
    fresh = _empty(pool)
    placed: list[tuple[_Choice, tuple[str, ...]]] = []
    for choice in members:
        servers = fresh.place(choice.job.gpus, _prefer(choice.job))
        if servers is None:
            return False
        placed.append((choice, servers))
    if not fresh.fits(gpus):
        cleared = _clear_a_server(pool, gpus, placed)
        if cleared is None:
            return False
        fresh, placed = cleared
    for choice, servers in placed:
        choice.servers = servers
    packing[pool.generation] = fresh
    return True


def _clear_a_server(
    pool: PoolState, gpus: int, placed: list[tuple[_Choice, tuple[str, ...]]]
) -> tuple[Packing, list[tuple[_Choice, tuple[str, ...]]]] | None:
    """A packing of `placed` that leaves one server of at least `gpus` GPUs empty, moving only
    the one-server jobs on it (the server holding the fewest GPUs that can so be cleared); or
    None. Gangs larger than a server are not helped: they need several servers cleared."""
    held: dict[str, int] = {server.id: 0 for server in pool.servers}
    spanning: set[str] = set()
    for choice, servers in placed:
        if len(servers) > 1:
            spanning.update(servers)
        else:
            held[servers[0]] += choice.job.gpus
    candidates = sorted(
        (s for s in pool.servers if s.gpus >= gpus and s.id not in spanning),
        key=lambda s: (held[s.id], s.id),
    )
    for target in candidates:
        fresh = _empty(pool)
        fresh.place(target.gpus, ((target.id,),))  # kept empty while the others are packed
        staying = [(c, servers) for c, servers in placed if target.id not in servers]
        moving = [c for c, servers in placed if target.id in servers]
        for choice, servers in staying:
            fresh.place(choice.job.gpus, (servers,))
        moved = [(c, fresh.place(c.job.gpus, ())) for c in moving]
        if all(servers is not None for _, servers in moved):
            fresh.release((target.id,), target.gpus)
            return fresh, staying + [(c, s) for c, s in moved if s is not None]
    return None


def _surplus_runs(
    snapshot: Snapshot,
    pools: list[PoolState],
    packing: dict[str, Packing],
    order: Mapping[str, Sequence[RunnableJob]],
    chosen: dict[str, _Choice],
    charged: Mapping[str, Mapping[str, float]],
    *,
    repack: bool = True,
) -> None:
    """Rule 3: idle GPUs to waiting jobs, most-owed users first, fastest fitting pool (without
    `repack`, chosen jobs keep their servers: they are running)."""
    if all(packing[p.generation].total == 0 for p in pools):
        return
    repacks = dict.fromkeys(packing, _REPACKS if repack else 0)

    def owed(user: str) -> tuple[float, int]:
        state = snapshot.users[user]
        entitled = sum(state.entitled.values())
        if entitled <= _EPS:
            return (0.0, state.seq)
        credit = sum(state.credit.values()) - sum(charged.get(user, {}).values())
        return (-_priority(credit, entitled), state.seq)

    # Only users with a job still waiting, in most-owed order. Jobs that start without moving
    # (that never ran, or whose servers are free) go first; those whose servers are taken
    # then take what is left.
    pool_of = _server_pools(pools).state
    # user -> its first job not chosen (C iterators: the chosen ones before it are many)
    first: dict[str, int] = {}
    for user, jobs in order.items():
        unchosen = map(operator.not_, map(chosen.__contains__, map(_ID, jobs)))
        index = next(itertools.compress(itertools.count(), unchosen), None)
        if index is not None:
            first[user] = index
    movers: list[RunnableJob] = []
    # The most GPUs free in any pool: a job of more starts nowhere, and `_start_fastest` is
    # spared (it would look at each pool and leave everything as it was).
    most = max(map(_TOTAL, packing.values()))
    fastest: dict[int, list[PoolState]] = {}  # `_fastest_for` by speeds (shared by many jobs)
    for user in sorted(first, key=owed):
        scanned = 0
        for job in itertools.islice(order[user], first[user], None):
            if job.id in chosen:
                continue
            scanned += 1
            if scanned > _SCAN_LIMIT:
                break
            own = _own(job)
            home = pool_of.get(own[0]) if own else None
            if home is None:
                if job.gpus <= most:
                    _start_fastest(job, pools, packing, chosen, repacks, fastest)
                    most = max(map(_TOTAL, packing.values()))
            elif job.speeds.get(home.generation, 0.0) > 0 and packing[home.generation].free_for(
                own, job.gpus
            ):
                packing[home.generation].place(job.gpus, (own,))
                chosen[job.id] = _Choice(job, home.generation, own)
                most = max(map(_TOTAL, packing.values()))
            else:
                movers.append(job)
        if most == 0:
            return
    # Whatever a move costs, a job that waits gains nothing while GPUs it fits idle: with
    # quanta shorter than a move (a live cluster at 3 s) it would otherwise never start.
    for job in movers:
        if job.gpus <= most:
            _start_fastest(job, pools, packing, chosen, repacks, fastest)
            most = max(map(_TOTAL, packing.values()))
            if most == 0:
                return


def _start_fastest(
    job: RunnableJob,
    pools: list[PoolState],
    packing: dict[str, Packing],
    chosen: dict[str, _Choice],
    repacks: dict[str, int],
    fastest: dict[int, list[PoolState]],
) -> None:
    """Start `job` on the fastest pool with room for it, if any. `fastest`: `_fastest_for`
    of the speeds seen so far in this decision, by identity (jobs of a type share them)."""
    order = fastest.get(id(job.speeds))
    if order is None:
        order = fastest[id(job.speeds)] = _fastest_for(job, pools)
    gpus = job.gpus
    for pool in order:
        # Fewer GPUs free than it asks: it does not fit, and `_fits` would change nothing.
        if gpus > packing[pool.generation].total or not _fits(pool, gpus, packing, chosen, repacks):
            continue
        servers = packing[pool.generation].place(gpus, _prefer(job))
        if servers is not None:
            chosen[job.id] = _Choice(job, pool.generation, servers)
            return


def _keep_pools(pools: list[PoolState], chosen: Mapping[str, _Choice]) -> None:
    """Rule 2's cost control: which of a user's chosen jobs fills which of its places is free
    (the stride only fixed how many GPUs the user runs in each pool), so jobs of the same size
    trade places until as many as possible stay in the pool they ran in. A group whose trade
    would put a job where it cannot run (a user's jobs of different types) keeps its places."""
    pool_of = _server_pools(pools).generation
    groups: defaultdict[tuple[str, int], list[_Choice]] = defaultdict(list)
    values = list(chosen.values())
    for key, choice in zip(map(_USER_SIZE, values), values, strict=True):
        groups[key].append(choice)
    for group in groups.values():
        if len(group) < 2:
            continue
        places: dict[str, list[tuple[str, ...]]] = {}
        for choice in group:
            places.setdefault(choice.pool, []).append(choice.servers)
        # Jobs of one type share their speeds' dict: each is looked at once.
        speeds = {id(table): table for table in map(_SPEEDS, group)}.values()
        if any(table.get(pool, 0.0) <= 0 for table in speeds for pool in places):
            continue
        unplaced: list[_Choice] = []
        for choice in group:
            own = _own(choice.job)
            ran = pool_of.get(own[0]) if own else None
            if ran is not None and places.get(ran):
                choice.pool, choice.servers = ran, places[ran].pop()
            else:
                unplaced.append(choice)
        left = [(pool, servers) for pool, taken in places.items() for servers in taken]
        for choice, (pool, servers) in zip(unplaced, left, strict=True):
            choice.pool, choice.servers = pool, servers


def _fast_first(
    pools: list[PoolState],
    packing: dict[str, Packing],
    chosen: dict[str, _Choice],
    quantum_s: float,
) -> bool:
    """Rule 4: idle GPUs of a faster pool take the jobs that gain most from moving there, when
    the gain over the next quanta exceeds what moving costs them beyond where they were put
    (rule 8). Returns whether any job moved."""
    moved = False
    for target in pools:
        room = packing[target.generation]
        if room.total == 0:
            continue
        candidates: list[tuple[float, int, _Choice]] = []
        for choice in chosen.values():
            job = choice.job
            if choice.pool == target.generation or job.gpus > room.total:
                continue
            here, there = job.speeds.get(choice.pool, 0.0), job.speeds.get(target.generation, 0.0)
            if there > here * (1 + _EPS) and _pays(
                (there / here - 1) * quantum_s * _HORIZON,
                (job.move_s if _own(job) else 0.0) - _switch_s(job, choice.servers),
            ):
                candidates.append((-there / here, job.seq, choice))
        candidates.sort(key=lambda c: (c[0], c[1]))
        for _, _, choice in candidates:
            if room.total == 0:
                break
            placed = room.place(choice.job.gpus, _prefer(choice.job))
            if placed is not None:
                packing[choice.pool].release(choice.servers, choice.job.gpus)
                choice.pool, choice.servers = target.generation, placed
                moved = True
    return moved


def _fastest_to_fastest(
    pools: list[PoolState],
    packing: dict[str, Packing],
    chosen: Mapping[str, _Choice],
    quantum_s: float,
) -> None:
    """Rule 7: when every runnable job runs, nobody is owed anything (`settle` books no quantum
    in which nobody waits), so each pool, fastest first, goes to the jobs that gain most from
    it over the slower pools, instead of to whoever the stride happened to visit there first.
    A job gaining nothing from a faster pool (it runs as fast or faster on a slower one) is
    not put there while a slower one has room. When the new assignment cannot hold every job
    (gangs and fragmentation), the decision stands. A job's speed in each pool is weighed by
    the part of the next quanta it runs there after moving (rule 8), so a job moves to a faster
    pool only when the gain repays the move."""
    if len(pools) < 2:
        return
    pool_of = _server_pools(pools).generation
    fresh = {p.generation: _empty(p) for p in pools}
    target: dict[str, tuple[str, tuple[str, ...]]] = {}
    left = list(chosen.values())
    generations = [p.generation for p in pools]
    work = {c.job.id: _work(c.job, generations, pool_of, quantum_s) for c in left}
    for index, pool in enumerate(pools):
        gains = {c.job.id: _gain(work[c.job.id], index) for c in left}
        ranked = sorted(
            (c for c in left if gains[c.job.id] > 1 + _EPS),
            key=lambda c: (-gains[c.job.id], c.pool != pool.generation, c.job.seq),
        )
        for choice in ranked:
            servers = fresh[pool.generation].place(choice.job.gpus, _prefer(choice.job))
            if servers is not None:
                target[choice.job.id] = (pool.generation, servers)
        left = [c for c in left if c.job.id not in target]
    left.sort(key=lambda c: (-c.job.gpus, c.job.seq))
    for choice in left:  # no gain anywhere, or no room where it gains: the fastest that fits
        for pool in _fastest_for(choice.job, pools):
            servers = fresh[pool.generation].place(choice.job.gpus, _prefer(choice.job))
            if servers is not None:
                target[choice.job.id] = (pool.generation, servers)
                break
        if choice.job.id not in target:
            return
    for choice in chosen.values():
        choice.pool, choice.servers = target[choice.job.id]
    packing.update(fresh)
    _affinity(pools, packing, chosen)  # the same sets, packed to stay where they ran


def _fastest_for(job: RunnableJob, pools: Iterable[PoolState]) -> list[PoolState]:
    """The pools `job` can run in, fastest for it first."""
    fitting = [p for p in pools if job.speeds.get(p.generation, 0.0) > 0]
    return sorted(fitting, key=lambda p: -job.speeds[p.generation])


def _work(
    job: RunnableJob, generations: Sequence[str], pool_of: Mapping[str, str], quantum_s: float
) -> list[float]:
    """What `job` does on each of `generations` over the next quanta, moves paid."""
    own = _own(job)
    lives = pool_of.get(own[0]) if own else None
    horizon = quantum_s * _HORIZON
    speeds, move_s = job.speeds, job.move_s
    return [
        speeds.get(where, 0.0)
        * max(0.0, horizon - (0.0 if lives is None or lives == where else move_s))
        for where in generations
    ]


def _gain(work: Sequence[float], index: int) -> float:
    """How much more a job doing `work` (`_work`) does on pool `index` than on the best of the
    slower ones (inf when only here fits it, 0 when it does not fit here)."""
    here = work[index]
    rest = max(work[index + 1 :], default=0.0)
    if here <= 0:
        return 0.0
    return here / rest if rest > 0 else float("inf")


def _affinity(
    pools: list[PoolState], packing: dict[str, Packing], chosen: Mapping[str, _Choice]
) -> None:
    """Rule 5: pack each pool's chosen jobs again, staying where they ran when possible."""
    members: dict[str, list[_Choice]] = {p.generation: [] for p in pools}
    for choice in chosen.values():
        members[choice.pool].append(choice)
    for pool in pools:
        room = _empty(pool)
        attempt: list[tuple[_Choice, tuple[str, ...]]] = []
        # Jobs that stay come first, then those going back to their checkpoint's servers,
        # then the rest (jobs coming from another pool among them: they have no place here to
        # keep, and placed first they would take the place of a job that stays), largest
        # gangs first (they are the hardest to fit), then by arrival.
        here = room.size
        parts: tuple[list[_Choice], ...] = ([], [], [], [])
        for choice in members[pool.generation]:
            running, home = choice.job.running, choice.job.home
            stays = bool(running) and running[0] in here
            returns = bool(home) and home[0] in here
            parts[(0 if stays else 2) + (0 if returns else 1)].append(choice)
        for part in parts:
            part.sort(key=_ARRIVAL)
            part.sort(key=_SIZE, reverse=True)  # stable: equal sizes stay in arrival order
            for choice in part:
                job = choice.job
                servers = room.place(job.gpus, (job.running, job.home))
                if servers is None:
                    break
                attempt.append((choice, servers))
            else:
                continue
            break
        else:
            for choice, servers in attempt:
                choice.servers = servers
            packing[pool.generation] = room


def settle(
    users: Mapping[str, UserState],
    ran: Iterable[RunnableJob],
    decision: Decision,
    ceiling: Mapping[str, float],
    overrun: Mapping[str, Mapping[str, float]] | None = None,
    unheld: Mapping[str, Mapping[str, float]] | None = None,
) -> bool:
    """Book a quantum into the credits and job passes the next snapshot carries; return
    whether it was booked.

    First `overrun` (the snapshot's: GPU-quanta users' jobs held after they were told to let
    go) is charged, whether or not this quantum is booked: those GPUs were denied to whoever
    the earlier decision gave them, so a user whose jobs ignore their yields pays for every
    GPU-second they held, not for what the decisions said. Credits have no floor: the debt is
    worked off at the user's entitlement, while the others run. Likewise `unheld` (GPU-quanta
    the last booked decision charged for that the user's jobs did not hold, starting late) is
    given back: each GPU-second is charged once, to whoever held it. Without it the seconds a
    yielding gang still held were charged twice, to the gang's user as overrun and to the user
    the decision gave them, and a small user beside whole-server gangs received two thirds of
    its share at 3 s quanta.

    Each user's credit in each pool grows by its entitlement and falls by what it was charged,
    capped at ``max(ceiling[user], _CREDIT_QUANTA * entitlement) + entitlement`` so that share a
    user cannot use (no job of its fits that pool) does not pile up into a later monopoly;
    `ceiling` is the user's largest gang, which a waiting gang must be able to save up for. Each
    job that ran (`ran`, the decision's jobs) advances its pass by its GPUs over its weight.
    Quanta in which no job waits are not booked: nobody was denied anything.
    """
    for corrections, sign in ((overrun, -1.0), (unheld, 1.0)):
        for name, held in (corrections or {}).items():
            owner = users.get(name)
            if owner is None:
                continue  # gone with its last job
            for generation, quanta in held.items():
                if generation in owner.credit:
                    owner.credit[generation] += sign * quanta
    if decision.waiting == 0:
        return False
    unusable = _unusable(users, decision)
    for name, user in users.items():
        spent = decision.charged.get(name, {})
        cap = ceiling.get(name, 1.0)
        for generation, entitled in user.entitled.items():
            owed = entitled - unusable.get((name, generation), 0.0)
            credit = user.credit.get(generation, 0.0) + owed - spent.get(generation, 0.0)
            user.credit[generation] = min(credit, max(cap, entitled * _CREDIT_QUANTA) + entitled)
    for job in ran:
        job.pass_ += job.gpus / job.weight
    return True


def _unusable(users: Mapping[str, UserState], decision: Decision) -> dict[tuple[str, str], float]:
    """(user, pool) -> the part of the user's entitlement there that sat idle for want of a
    job of its that fits, while the user ran elsewhere: owed to nobody, so not saved up.

    A pool's GPUs left idle by a work-conserving decision fit no waiting job. A user short of
    its entitlement beside them that runs jobs this quantum was served as far as its jobs fit:
    its other gangs are too large for the holes (a 4-GPU gang beside another user's two 1-GPU
    jobs on a 4-GPU server), and nobody denied it those GPUs. Were that shortfall saved up,
    the gang's user would win the next quanta and push the small user's jobs off, and the two
    would alternate: the small user, whose demand lies below its share and which max-min
    fairness serves first, would receive half of it. A user that runs nothing still saves up:
    its gang waits for room that only its credit can clear (an 8-GPU gang beside a 4-GPU job).
    The idle GPUs are taken off the running users' shortfalls, in proportion to them.
    """
    unusable: dict[tuple[str, str], float] = {}
    for generation, idle in decision.idle.items():
        short = {}
        for name, user in users.items():
            spent = decision.charged.get(name, {}).get(generation, 0.0)
            gap = user.entitled.get(generation, 0.0) - spent
            if gap > _EPS and name in decision.served:
                short[name] = gap
        total = sum(short.values())
        if total <= _EPS:
            continue
        taken = min(float(idle), total)
        for name, gap in short.items():
            unusable[(name, generation)] = taken * gap / total
    return unusable


# How many quanta of entitlement a user may save up beyond its largest gang.
_CREDIT_QUANTA = 8.0
