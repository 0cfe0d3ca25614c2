"""One quantum's decision, turned into what each server must do (docs/design.md §2.3, §2.7).

The kernel (`gfair.core.kernel.decide`) picks from the machine's snapshot which jobs hold GPUs
on which servers this quantum; this module books it (`kernel.settle`) and works out the
difference with what runs now, assigning concrete GPU indices (two jobs never hold one):

- a job that keeps running on its servers keeps its GPUs;
- a job leaving a server is suspended there (checkpoint, GPUs freed), or killed when a retry
  superseded its attempt; its node confirms before the job may run anywhere else;
- a job placed on other servers (a move) is suspended wherever it still runs and starts on its
  new servers once every old node let go (`start_at_once`): it never runs twice. Where nodes let
  go at once (`SchedulerConfig.moves_at_once`: the simulator) it starts in the plan, after the
  stops;
- a job entering takes free indices (its own parked ones when free, else preferably ones no
  other job is parked on); a node runs a GPU's commands in order, so a start listed after the
  suspends of its server finds their GPUs free.

Between ticks, `fill` gives idle GPUs (a job arrived, or one ended) to waiting jobs by the
kernel's `backfill`, where they are not promised to a moved job; nothing is booked for them
until the next tick (and `backfill` is not run when no waiting job fits the idle GPUs).
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import attrgetter
from typing import TYPE_CHECKING

from gfair.core import kernel
from gfair.core.kernel import Decision, Pass, RunnableJob, Snapshot, backfill, decide

from .plan import Forgotten, Placement, QuantumPlan, ServerTurn, Start, Starts, Stop, StopReason
from .residency import Phase, SchedulerJob, Stay
from .snapshot import snapshot

if TYPE_CHECKING:
    from .machine import SplitStride


def decide_quantum(machine: SplitStride, now: float, heard_until: float) -> QuantumPlan:
    # The GPUs held since the last tick charged; the residencies not running (`Meter.tick`).
    unsettled = machine.meter.tick(machine.index.resident_jobs(), machine.index.generations, now)
    forgotten = _expire(machine, unsettled, min(now, heard_until))
    view = snapshot(machine, now)
    decision = decide(view)
    _settle(machine, view, decision)
    placed = _place(machine, decision)
    moved = {job.key for job in placed}
    quantum = machine.quantum
    machine.quantum += 1
    scheduled = machine.index.schedulable
    jobs = machine.jobs
    runs = decision.runs
    stops: dict[str, list[Stop]] = {}
    for node in scheduled:
        node_id = node.node_id
        leaving = stops[node_id] = []
        here = machine.index.stays_on(node_id)
        if not here:
            continue
        chosen = runs.get(node_id, ())
        # (A copy: a superseded attempt's stay is dropped as it is stopped.)
        for key, held in list(here.items()):
            if not held.holds_gpus:
                continue
            job = jobs[key]
            if key not in chosen or key in moved or held.attempt != job.attempt:
                leaving.append(_stop(machine, job, held, now, quantum))
    # Moved jobs still resident anywhere start once their old nodes let go (unless the nodes
    # let go at once, `SchedulerConfig.moves_at_once`: then in this plan, after the stops);
    # their GPUs are promised to them until then (or until the next quantum decides anew).
    # (One moved in an earlier quantum and still waiting keeps its promise; the GPUs are its own
    # again only if this quantum left them free.)
    held_back: set[str] = set()
    if not machine.config.moves_at_once:
        held_back = {key for key in moved if machine.jobs[key].stays}
    waiting = {k for k in machine.held_back if k in machine.jobs and machine.jobs[k].stays}
    machine.held_back = held_back | waiting
    sizes = machine.index.sizes
    turns: list[ServerTurn] = []
    short: list[tuple[str, str]] = []
    # The gangs across servers (the kernel places every job that runs: `Decision.placed`).
    wide = {key for key, servers in decision.placed.items() if len(servers) > 1}
    for node in scheduled:
        node_id = node.node_id
        run = runs.get(node_id, ())
        entering: list[SchedulerJob] = []
        for key in run:
            job = jobs[key]
            stay = job.stays.get(node_id)
            if stay is not None and stay.holds_gpus and stay.attempt == job.attempt:
                continue  # keeps running on its GPUs
            if key not in held_back:
                entering.append(job)
        central = bool(wide) and not wide.isdisjoint(run)
        if not entering:  # (a server where nothing enters needs none of its indices looked up)
            turns.append(ServerTurn(node_id, quantum, central, tuple(stops[node_id]), (), run))
            continue
        starts: list[Start] = []
        free = machine.index.free_indices(machine.nodes.get(node_id))
        parked = machine.index.parked_on(node_id)
        # Jobs parked in place here pick first, so that their own GPUs are still free for them.
        if len(entering) > 1 and any(job.parked_on(node_id) for job in entering):
            entering.sort(key=lambda job: not job.parked_on(node_id))
        for job in entering:
            need = job.gpus_on(node_id, sizes)
            if len(free) < need:
                short.append((job.key, node_id))
                continue
            picked = _pick_indices(job, node_id, free, need, parked)
            free = free[need:] if picked == free[:need] else [i for i in free if i not in picked]
            starts.append(_start(machine, job, node_id, tuple(picked), now, quantum))
        turns.append(
            ServerTurn(node_id, quantum, central, tuple(stops[node_id]), tuple(starts), run)
        )
    names = machine.index.names
    strays: tuple[Stop, ...] = ()
    if any(node_id not in names for node_id in machine.index.on_node):
        strays = tuple(
            _stop(machine, job, stay, now, quantum, drain=True)
            for job in machine.index.resident_jobs()
            for stay in list(job.stays.values())
            if stay.node_id not in names and stay.holds_gpus
        )
    return QuantumPlan(
        quantum,
        tuple(turns),
        strays,
        tuple(_placement(job, decision.chosen_by.get(job.key)) for job in placed),
        decision.waiting,
        forgotten,
        tuple(short),
    )


_NO_STARTS = Starts()


def start_at_once(machine: SplitStride, key: str, now: float, *, arrival: bool) -> Starts:
    """Start `key` between ticks if it may (module doc): a moved job the quantum held back, once
    its old nodes let go, on its new servers; a retry on the servers it ran on, when they are
    still there; any other `arrival` (admitted, or retried) through `fill`. Any other job waits
    for the next quantum: the last one chose not to run it."""
    job = machine.jobs.get(key)
    if job is None or job.stays or not machine.runnable(job, now):
        return _NO_STARTS
    names = machine.index.names
    if key in machine.held_back:
        servers = job.servers
    elif not arrival:
        return _NO_STARTS
    elif job.servers and all(s in names for s in job.servers):
        servers = job.servers  # a retry where it ran
    else:
        return fill(machine, now)
    return Starts(_start_on(machine, job, servers, now) or ())


def fill(machine: SplitStride, now: float) -> Starts:
    """Idle GPUs to waiting jobs between ticks: the kernel's `backfill`, the rule the simulator
    applies when a job ends or arrives mid-quantum, so no GPU idles until the next tick while a
    job that fits waits. A job it names starts only where its GPUs are free and not promised to
    a held-back job, and only on the servers it is still suspending on, if any; nothing is booked
    for it until the next tick."""
    if machine.index.free_gpus() <= 0:
        return _NO_STARTS
    index = machine.index
    index.queues.refresh(machine, now, index.pools[1])
    least = machine.index.queues.least_waiting()
    if least is None or least > machine.index.free_gpus():
        # No job that holds no GPUs fits in what is idle. (`backfill` could name only a job
        # already running, and only on servers off the ones it runs on, which the loop below
        # passes over.)
        return _NO_STARTS
    # Shares as of the last tick: they only order the waiting users here. A user new since
    # joins its pools at the next tick, with every other newcomer of the quantum: joined one
    # by one between ticks, a newcomer would join at the credit of an earlier one measured
    # against that one's since-shrunk share, ever further ahead (`accounts.entitle`).
    view = snapshot(machine, now, entitle=False)  # (the queues are as just refreshed)
    # The running jobs the snapshot holds: an array's beyond its limit are not in it.
    in_arrays = machine.index.queues.in_arrays()
    holding = [state for state in machine.index.queues.running() if state.user not in in_arrays]
    holding += [s for user in in_arrays for s in view.jobs.get(user, ()) if s.running]
    turns: list[ServerTurn] = []
    placed: list[Placement] = []
    for key, servers in backfill(view, holding).items():
        job = machine.jobs[key]
        if any(node not in servers for node in job.stays):
            # Still being suspended elsewhere: it starts there once that node let go (a
            # released event fills again), never while it may still run.
            continue
        moved = servers != job.servers
        started = _start_on(machine, job, servers, now)
        if started:
            turns.extend(started)
            if moved:
                placed.append(_placement(job, Pass.BACKFILL))
    return Starts(tuple(turns), tuple(placed))


def _expire(
    machine: SplitStride, unsettled: list[tuple[SchedulerJob, Stay]], heard_until: float
) -> tuple[Forgotten, ...]:
    """Drop starts and suspends no node confirmed in time (of the `unsettled` residencies);
    what was dropped. Timed by what was heard (`Tick.heard_until`): a confirmation sent but not
    read yet is no silence, and a command forgotten while its node carries it out would put
    the job on two servers."""
    config = machine.config
    dropped: list[Forgotten] = []
    for job, stay in unsettled:
        wait = config.unconfirmed_release_s if stay.unconfirmed else config.release_timeout_s
        if heard_until - stay.since > wait:
            machine.unreside(job, stay.node_id)
            dropped.append(Forgotten(job.key, stay.node_id, stay.phase, not stay.unconfirmed))
    return tuple(dropped)


def _settle(machine: SplitStride, view: Snapshot, decision: Decision) -> None:
    """Book the quantum into the users' credits and the passes of the jobs that ran."""
    # The machine's own states: the kernel advances their passes, and the queues put them in
    # their new places at once (`Queues.repass`).
    # The kernel books into copies of the index's states: a job's pass is its own
    # (`SchedulerJob.stride_pass`), and the index derives its state from it (`repass`).
    ran = [_copy(state) for state in machine.index.queues.states(decision.placed)]
    ceiling = machine.index.ceilings()
    booked = kernel.settle(machine.users, ran, decision, ceiling, view.overrun, view.unheld)
    machine.meter.booked(decision, booked)
    if booked:
        machine.repass(ran)


# A state's fields in order (`_copy`: field by field costs a tenth of `copy.copy`, for every job
# that ran).
_FIELDS = attrgetter(*RunnableJob.__slots__)


def _copy(state: RunnableJob) -> RunnableJob:
    return RunnableJob(*_FIELDS(state))


def _place(machine: SplitStride, decision: Decision) -> list[SchedulerJob]:
    """Take the decision's placements; the jobs placed on other servers than before."""
    pool_of = machine.index.generations
    moved: list[SchedulerJob] = []
    for key, servers in decision.placed.items():
        job = machine.jobs[key]
        if job.servers != servers:
            job.servers, job.generation = servers, pool_of[servers[0]]
            machine.touch(key)
            moved.append(job)
    return moved


def _pick_indices(
    job: SchedulerJob,
    node_id: str,
    free: list[int],
    need: int,
    parked: Mapping[str, tuple[int, ...]],
) -> list[int]:
    """`need` of the `free` indices of `node_id` for `job`: the ones it is parked on there,
    when free (it then resumes in place, without a checkpoint); else preferably ones no other
    job is parked on (`parked`: `SplitStride.parked_on(node_id)`, looked up once per node);
    else the lowest."""
    if job.parked is not None and job.parked[0] == node_id:
        own = [i for i in job.parked[1] if i in free]
        if len(own) == need:
            return own
    if not parked:
        return free[:need]  # (the common case: nothing parked here)
    reserved = {i for key, indices in parked.items() if key != job.key for i in indices}
    unclaimed = [i for i in free if i not in reserved]
    claimed = [i for i in free if i in reserved]
    return (unclaimed + claimed)[:need]


def _start_on(
    machine: SplitStride, job: SchedulerJob, servers: tuple[str, ...], now: float
) -> tuple[ServerTurn, ...] | None:
    """Start `job` on `servers` with free GPU indices there; None when they are not free."""
    key = job.key
    sizes = machine.index.sizes
    before = job.servers, job.generation
    job.servers = servers
    machine.touch(key)
    picks: dict[str, tuple[int, ...]] = {}
    for node_id in servers:
        need = job.gpus_on(node_id, sizes)
        free = machine.index.free_indices(machine.nodes.get(node_id))
        if key not in machine.held_back:
            free = free[: max(0, len(free) - machine.index.promised(node_id))]
        if len(free) < need:
            job.servers = before[0]
            return None
        parked = machine.index.parked_on(node_id)
        picks[node_id] = tuple(_pick_indices(job, node_id, free, need, parked))
    machine.let_go(key)
    if servers != before[0]:
        node = machine.nodes.get(servers[0])
        job.generation = node.generation if node is not None else before[1]
    quantum = max(machine.quantum - 1, 0)
    turns = []
    for node_id, indices in picks.items():
        start = _start(machine, job, node_id, indices, now, quantum)
        running = tuple(k for k, s in machine.index.stays_on(node_id).items() if s.holds_gpus)
        turns.append(ServerTurn(node_id, quantum, len(servers) > 1, (), (start,), running))
    return tuple(turns)


def _start(
    machine: SplitStride,
    job: SchedulerJob,
    node_id: str,
    indices: tuple[int, ...],
    now: float,
    quantum: int,
) -> Start:
    stay = job.stays.get(node_id)
    pending = stay.pending_suspends if stay is not None else 0
    machine.reside(job, Stay(node_id, Phase.STARTING, job.attempt, indices, now, quantum, pending))
    release = None
    if job.parked is not None and job.parked[0] != node_id:
        # Parked elsewhere: that node checkpoints it, and this one waits for the checkpoint.
        release = job.parked[0]
        machine.park(job, None)
    return Start(
        job.user,
        job.job_id,
        job.attempt,
        node_id,
        indices,
        job.servers,
        job.generation,
        release,
        start_deadline(machine, now),
    )


def start_deadline(machine: SplitStride, now: float) -> float:
    """Until when a start sent at `now` stands: the machine forgets a start no node confirmed
    after `release_timeout_s`, and one it stopped unconfirmed `unconfirmed_release_s` after the
    stop, which comes at a tick, the next one at the earliest; after either, the job may run
    elsewhere. A node reading the start later (its executor was down, its commands queued)
    refuses it, judging from the command alone, so that the job never runs twice."""
    config = machine.config
    last_tick = machine.meter.last_tick_at
    # (Before the first tick, it may come at once; the service keeps its ticks on one grid,
    # across its restarts too.)
    next_tick = now if last_tick is None else max(now, last_tick + config.quantum_s)
    return min(now + config.release_timeout_s, next_tick + config.unconfirmed_release_s)


def _stop(
    machine: SplitStride,
    job: SchedulerJob,
    stay: Stay,
    now: float,
    quantum: int,
    *,
    drain: bool = False,
) -> Stop:
    if stay.attempt < job.attempt:
        # That attempt failed and was retried: its leftover processes are of no use.
        machine.unreside(job, stay.node_id)
        return Stop(
            job.user,
            job.job_id,
            stay.node_id,
            stay.attempt,
            f"attempt {stay.attempt} was superseded",
        )
    if drain:
        reason = StopReason.DRAIN
    elif stay.node_id not in job.servers:
        reason = StopReason.MIGRATION
    else:
        reason = StopReason.TIME_SLICE
    stay.unconfirmed = stay.phase is Phase.STARTING
    job.ran(stay, now)
    machine.suspend(job, stay)  # (marks the job changed, with what follows)
    stay.pending_suspends += 1
    stay.since = now
    stay.quantum = quantum
    return Stop(job.user, job.job_id, stay.node_id, stay.attempt, reason)


def _placement(job: SchedulerJob, chosen_by: str | None) -> Placement:
    assert job.generation is not None
    return Placement(job.user, job.job_id, job.servers, job.generation, chosen_by)
