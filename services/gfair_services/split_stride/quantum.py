"""One quantum's decision, turned into what each node must do (docs/design.md §2.3, §2.7).

The decision kernel (`gfair.core.kernel.decide`) picks, from the ledger's snapshot, which jobs
hold GPUs on which servers this quantum; this module books it (`kernel.settle`) and works out
the difference with what runs now, assigning concrete GPU indices:

- a job that keeps running on its servers keeps its GPUs;
- a job leaving a server is suspended there (checkpoint, GPUs freed), or killed when its attempt
  was superseded by a retry; its node confirms before the job may run anywhere else;
- a job the kernel placed on other servers than before (a move, within or between pools) is
  suspended wherever it still runs and starts on its new servers once every old node confirmed
  it let go (`start_at_once` then): it never runs twice;
- a job entering takes free indices; since a node executor handles its commands one at a time in
  order, a start listed after the suspends of the same server finds their GPUs free. Two jobs
  never hold the same index in the ledger.

`start_at_once` starts jobs between ticks: a moved job once its old nodes let go, and, to be
work-conserving, `fill` gives GPUs left idle (a job arrived, or one ended) to waiting jobs by
the kernel's `backfill`, where they are not promised to a moved job; nothing is booked for
them until the next tick.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import structlog

from gfair.core.kernel import backfill, decide
from gfair.events.reasons import SuspendReason
from gfair.state.stride_record import Phase

from .ledger import Job, Ledger, Stay

_log = structlog.get_logger("gfair.split_stride")


@dataclass(frozen=True, slots=True)
class Start:
    job: Job
    node_id: str
    gpu_indices: tuple[int, ...]
    # A node where the job is parked in place, told to let go (checkpoint and exit) first.
    release: str | None = None


@dataclass(frozen=True, slots=True)
class Stop:
    job: Job
    node_id: str
    attempt: int
    reason: SuspendReason | str  # a str reason means kill, not suspend

    @property
    def kill(self) -> bool:
        return not isinstance(self.reason, SuspendReason)


@dataclass
class ServerTurn:
    """What changes on one server: stops first, then starts; and what runs afterwards."""

    node_id: str
    central: bool = False
    stops: list[Stop] = field(default_factory=list)
    starts: list[Start] = field(default_factory=list)
    running: tuple[str, ...] = ()


@dataclass
class QuantumPlan:
    quantum: int
    turns: list[ServerTurn]
    # Jobs to stop on nodes that are no longer scheduled (quarantined): drained.
    strays: list[Stop]
    placed: list[Job]  # jobs the kernel placed on other servers than before
    waiting: int  # runnable jobs that hold no GPUs this quantum


@dataclass
class Starts:
    turns: list[ServerTurn]
    placed: list[Job]  # jobs placed for the first time (or again) to start now


def decide_quantum(ledger: Ledger, now: datetime) -> QuantumPlan:
    ledger.account(now)
    for key, expired in ledger.expire(now):
        _log.warning(
            "node never confirmed; forgetting",
            job=key,
            node_id=expired.node_id,
            phase=expired.phase,
            start_confirmed=not expired.unconfirmed,
        )
    snapshot = ledger.snapshot(now)
    decision = decide(snapshot)
    ledger.settle(snapshot, decision)
    placed = ledger.place(decision)
    moved = {job.key for job in placed}
    quantum = ledger.quantum
    ledger.quantum += 1
    scheduled = ledger.schedulable()
    turns: list[ServerTurn] = []
    for entry in scheduled:
        node_id = entry.node_id
        run = decision.runs.get(node_id, ())
        turn = ServerTurn(
            node_id, central=any(len(ledger.jobs[key].servers) > 1 for key in run), running=run
        )
        chosen = set(run)
        for key, held in ledger.holders(node_id).items():
            job = ledger.jobs[key]
            if key not in chosen or key in moved or held.attempt != job.attempt:
                turn.stops.append(_stop(job, held, now, quantum))
        turns.append(turn)
    # Moved jobs still resident anywhere start once their old nodes let go; their GPUs are
    # promised to them until then (or until the next quantum decides anew).
    # (One moved in an earlier quantum and still waiting keeps its promise; the GPUs are its own
    # again only if this quantum left them free.)
    held_back = {key for key in moved if ledger.jobs[key].stays}
    waiting = {k for k in ledger.held_back if k in ledger.jobs and ledger.jobs[k].stays}
    ledger.held_back = held_back | waiting
    sizes = ledger.sizes()
    for turn in turns:
        free = ledger.free_indices(turn.node_id)
        # Jobs parked in place here pick first, so that their own GPUs are still free for them.
        entering = sorted(turn.running, key=lambda k: _parked_on(ledger.jobs[k], turn.node_id))
        parked = ledger.parked_on(turn.node_id)
        for key in entering:
            job = ledger.jobs[key]
            stay = job.stays.get(turn.node_id)
            if stay is not None and stay.holds_gpus and stay.attempt == job.attempt:
                continue  # keeps running on its GPUs
            if key in held_back:
                continue
            need = job.gpus_on(turn.node_id, sizes)
            if len(free) < need:
                _log.error("not enough free GPUs for a chosen job", job=key, node_id=turn.node_id)
                continue
            picked = ledger.pick_indices(job, turn.node_id, free, need, parked)
            indices, free = tuple(picked), [i for i in free if i not in picked]
            turn.starts.append(_start(ledger, job, turn.node_id, indices, now, quantum))
    names = {entry.node_id for entry in scheduled}
    strays = [
        _stop(job, stay, now, quantum, drain=True)
        for job in ledger.residents()
        for stay in list(job.stays.values())
        if stay.node_id not in names and stay.holds_gpus
    ]
    return QuantumPlan(quantum, turns, strays, placed, decision.waiting)


def start_at_once(ledger: Ledger, key: str, now: datetime, *, arrival: bool) -> Starts:
    """Start `key` between ticks if it may (module doc): a moved job the quantum held back, once
    its old nodes let go, on its new servers; a retry on the servers it ran on, when they are
    still there; any other `arrival` (admitted, or retried) through `fill`. Any other job waits
    for the next quantum: the last one chose not to run it."""
    job = ledger.jobs.get(key)
    if job is None or not ledger.runnable(job, now) or job.stays:
        return Starts([], [])
    names = {entry.node_id for entry in ledger.schedulable()}
    if key in ledger.held_back:
        servers = job.servers
    elif not arrival:
        return Starts([], [])
    elif job.servers and all(s in names for s in job.servers):
        servers = job.servers  # a retry where it ran
    else:
        return fill(ledger, now)
    turns = _start_on(ledger, job, servers, now)
    return Starts(turns or [], [])


def fill(ledger: Ledger, now: datetime) -> Starts:
    """Idle GPUs to waiting jobs between ticks: the kernel's `backfill`, the rule the simulator
    applies when a job ends or arrives mid-quantum, so no GPU idles until the next tick while a
    job that fits waits. A job it names starts only where its GPUs are free and not promised to
    a held-back job, and only on the servers it is still suspending on, if any; nothing is booked
    for it until the next tick."""
    if ledger.free_gpus() <= 0:
        return Starts([], [])
    snapshot = ledger.snapshot(now)
    holding = [state for queue in snapshot.jobs.values() for state in queue if state.running]
    turns: list[ServerTurn] = []
    placed: list[Job] = []
    for key, servers in backfill(snapshot, holding).items():
        job = ledger.jobs[key]
        if any(node not in servers for node in job.stays):
            # Still being suspended elsewhere: it starts there once that node let go (a
            # released event fills again), never while it may still run.
            continue
        moved = servers != job.servers
        started = _start_on(ledger, job, servers, now)
        if started:
            turns.extend(started)
            if moved:
                placed.append(job)
    return Starts(turns, placed)


def _start_on(
    ledger: Ledger, job: Job, servers: tuple[str, ...], now: datetime
) -> list[ServerTurn] | None:
    """Start `job` on `servers` with free GPU indices there; None when they are not free."""
    key = job.key
    sizes = ledger.sizes()
    before = job.servers, job.generation
    job.servers = servers
    picks: dict[str, tuple[int, ...]] = {}
    for node_id in servers:
        need = job.gpus_on(node_id, sizes)
        free = ledger.free_indices(node_id)
        if key not in ledger.held_back:
            free = free[: max(0, len(free) - ledger.promised(node_id, sizes))]
        if len(free) < need:
            job.servers = before[0]
            return None
        parked = ledger.parked_on(node_id)
        picks[node_id] = tuple(ledger.pick_indices(job, node_id, free, need, parked))
    ledger.held_back.discard(key)
    if servers != before[0]:
        entry = ledger.inventory.get(servers[0])
        job.generation = entry.generation if entry is not None else before[1]
    quantum = max(ledger.quantum - 1, 0)
    turns = []
    for node_id, indices in picks.items():
        start = _start(ledger, job, node_id, indices, now, quantum)
        turn = ServerTurn(node_id, central=len(servers) > 1, starts=[start])
        turn.running = tuple(ledger.holders(node_id))
        turns.append(turn)
    return turns


def _start(
    ledger: Ledger, job: Job, node_id: str, indices: tuple[int, ...], now: datetime, quantum: int
) -> Start:
    stay = job.stays.get(node_id)
    pending = stay.pending_suspends if stay is not None else 0
    ledger.reside(job, Stay(node_id, Phase.STARTING, job.attempt, indices, now, quantum, pending))
    release = None
    if job.parked is not None and job.parked[0] != node_id:
        # Parked elsewhere: that node checkpoints it, and this one waits for the checkpoint.
        release, job.parked = job.parked[0], None
    return Start(job, node_id, indices, release)


def _parked_on(job: Job, node_id: str) -> bool:
    """False sorts first: whether `job` is *not* parked in place on `node_id`."""
    return not (job.parked is not None and job.parked[0] == node_id)


def _stop(job: Job, stay: Stay, now: datetime, quantum: int, *, drain: bool = False) -> Stop:
    if stay.attempt < job.attempt:
        # That attempt failed and was retried: its leftover processes are of no use.
        del job.stays[stay.node_id]
        return Stop(job, stay.node_id, stay.attempt, f"attempt {stay.attempt} was superseded")
    if drain:
        reason = SuspendReason.DRAIN
    elif stay.node_id not in job.servers:
        reason = SuspendReason.MIGRATION
    else:
        reason = SuspendReason.TIME_SLICE
    stay.unconfirmed = stay.phase is Phase.STARTING
    stay.phase = Phase.SUSPENDING
    stay.pending_suspends += 1
    stay.since = now
    stay.quantum = quantum
    return Stop(job, stay.node_id, stay.attempt, reason)
