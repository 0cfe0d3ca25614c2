"""Rules 1 and 2: the stride over users' entitlements, per pool, with jobs free of pools.

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
   there, else in the turn's pool, GPU for GPU: `moves.charge`). Among a user's chosen jobs of
   one size, those that ran in a pool the user runs in again keep their places there
   (`keep_pools`).

Jobs are visited within their user by (pass, arrival), as the snapshot lists them; at most
`SCAN_LIMIT` of a user's jobs that do not fit are passed over per visit, so a quantum costs what
runs rather than what waits. A long queue's jobs are sorted by the pool they live in as the
decision reaches them, so that a visit in one pool passes over those living in the others without
looking at each (`_Queue`); the decision is the one a look at every job in order makes
(tests/core/test_kernel_paths.py).
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable, Mapping, Sequence

from gfair.core.packing import Packing

from .affinity import REPACKS
from .affinity import fits as fits_in
from .cycle import EPS, Choice, Cycle, Pass, PoolState, RunnableJob, UserState
from .moves import charge, owed_enough, saves_up

# Jobs of one user that a visit may skip (do not fit the pool) before the entry gives up for
# this quantum: bounds a visit's cost when a user has thousands of queued jobs.
SCAN_LIMIT = 64
# Users with more jobs than this have them sorted by the pool they live in as a decision looks
# at them, so that a visit in one pool does not look at each job living in another.
_SHORT_QUEUE = 16


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
        queue.classify(min(len(queue.jobs), end + SCAN_LIMIT), pool_of)
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


def entitled_runs(cycle: Cycle) -> None:
    """Rule 1: the per-pool stride over users' entitlements."""
    snapshot, pools, packing, chosen = cycle.snapshot, cycle.pools, cycle.packing, cycle.chosen
    order, charged, chosen_by = cycle.order, cycle.charged, cycle.chosen_by
    users = snapshot.users
    heap: list[tuple[float, int, int, str]] = []
    ranked = [(pool.generation, pool.speed_rank) for pool in pools]
    for user in order:
        state = users[user]
        shares, credits, seq = state.entitled, state.credit, state.seq
        for generation, speed_rank in ranked:
            entitled = shares.get(generation, 0.0)
            if entitled > EPS:
                # `priority`, inline: this loop runs for every user and pool each quantum
                priority = round((credits.get(generation, 0.0) + entitled) / entitled, 9)
                heap.append((-priority, seq, speed_rank, user))
    heapq.heapify(heap)
    pool_of = cycle.layout.rank
    generations = [pool.generation for pool in pools]
    npools = len(pools)
    queues: dict[str, _Queue] = {}
    full = [False] * npools  # by rank: found without a free GPU
    done: set[str] = set()  # users all of whose jobs run
    open_pools = npools
    repacks = dict.fromkeys(packing, REPACKS)
    fits = [functools.partial(fits_in, pool, cycle=cycle, repacks=repacks) for pool in pools]
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
        # order (at most `SCAN_LIMIT`), the first that runs here without moving, where nearly
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
        end = index + SCAN_LIMIT if index + SCAN_LIMIT < count else count
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
        chosen[job.id] = Choice(job, where, servers)
        chosen_by[job.id] = Pass.STRIDE
        paid = generation if where == generation else charge(job, state, spent, generation, where)
        spent[paid] = spent.get(paid, 0.0) + float(job.gpus)
        entitled = state.entitled[generation]
        credit = state.credit.get(generation, 0.0) - spent.get(generation, 0.0)
        back = (-round((credit + entitled) / entitled, 9), seq, rank, user)  # `priority`


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
    (`owed_enough`: from another pool, or from its own servers here, taken). Failing that, the
    first whose servers are free in another pool runs there, on this pool's turn. A job that
    would have to move and for which it does not pay waits for its servers (`surplus.surplus_runs`
    gives it GPUs nobody else takes). `marks[len(pools) + rank]` is where the last look of the
    kind stopped."""
    pool = pools[rank]
    generation = pool.generation
    room = packing[generation]
    owed: dict[tuple[int, float, str, bool], bool] = {}  # the same for most of a user's jobs
    saves: bool | None = None  # `saves_up`, once a job waits
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
                    saves = saves_up(jobs, state)
                enough = owed[case] = owed_enough(
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
