"""One quantum's decision, turned into what each node must do (docs/design.md §2.3).

The core `SplitStride` picks which jobs hold GPUs on each server this quantum; this module works
out the difference with what runs now and assigns concrete GPU indices:

- a job that keeps running keeps its GPUs;
- a job leaving a server is suspended there (checkpoint, GPUs freed), or killed when its attempt
  was superseded by a retry; its node confirms before the job may run anywhere else;
- a job entering takes free indices; since a node executor handles its commands one at a time in
  order, a start listed after the suspends of the same server finds their GPUs free. Two jobs
  never hold the same index in the ledger.

`start_at_once` is the work-conserving exception: a newly placed job whose servers have enough
idle GPUs starts without waiting for the next tick (the stride re-decides at that tick).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import structlog

from gfair.events.reasons import SuspendReason
from gfair.state.stride_record import Phase

from .ledger import Job, Ledger, Stay

_log = structlog.get_logger("gfair.split_stride")


@dataclass(frozen=True, slots=True)
class Start:
    job: Job
    node_id: str
    gpu_indices: tuple[int, ...]


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
    ledger.sync(now)
    runs = ledger.stride.schedule()
    quantum = ledger.quantum
    ledger.quantum += 1
    sizes = ledger.sizes()
    turns: list[ServerTurn] = []
    for entry in ledger.schedulable():
        node_id = entry.node_id
        run = runs.get(node_id, ())
        turn = ServerTurn(
            node_id, central=any(len(ledger.jobs[key].servers) > 1 for key in run), running=run
        )
        chosen = set(run)
        for key, held in ledger.holders(node_id).items():
            job = ledger.jobs[key]
            if key not in chosen or held.attempt != job.attempt:
                turn.stops.append(_stop(job, held, now, quantum))
        free = ledger.free_indices(node_id)
        for key in run:
            job = ledger.jobs[key]
            stay = job.stays.get(node_id)
            if stay is not None and stay.holds_gpus and stay.attempt == job.attempt:
                continue  # keeps running on its GPUs
            need = job.gpus_on(node_id, sizes)
            if len(free) < need:
                _log.error("not enough free GPUs for a chosen job", job=key, node_id=node_id)
                continue
            indices, free = tuple(free[:need]), free[need:]
            turn.starts.append(_start(job, node_id, indices, now, quantum))
        turns.append(turn)
    scheduled = {entry.node_id for entry in ledger.schedulable()}
    strays = [
        _stop(job, stay, now, quantum, drain=True)
        for job in ledger.jobs.values()
        for stay in list(job.stays.values())
        if stay.node_id not in scheduled and stay.holds_gpus
    ]
    return QuantumPlan(quantum, turns, strays)


def start_at_once(ledger: Ledger, key: str, now: datetime) -> list[ServerTurn]:
    """Start `key` now if its servers have the idle GPUs it needs; the turns it takes."""
    if key not in ledger.jobs:
        return []
    ledger.sync_job(key, now)
    job = ledger.jobs.get(key)
    if job is None or not ledger.queued(key) or any(s.holds_gpus for s in job.stays.values()):
        return []
    sizes = ledger.sizes()
    picks: dict[str, tuple[int, ...]] = {}
    for node_id in job.servers:
        need = job.gpus_on(node_id, sizes)
        free = ledger.free_indices(node_id)
        if len(free) < need:
            return []
        picks[node_id] = tuple(free[:need])
    quantum = max(ledger.quantum - 1, 0)
    turns = []
    for node_id, indices in picks.items():
        start = _start(job, node_id, indices, now, quantum)
        turn = ServerTurn(node_id, central=len(job.servers) > 1, starts=[start])
        turn.running = tuple(ledger.holders(node_id))
        turns.append(turn)
    return turns


def _start(job: Job, node_id: str, indices: tuple[int, ...], now: datetime, quantum: int) -> Start:
    stay = job.stays.get(node_id)
    pending = stay.pending_suspends if stay is not None else 0
    job.stays[node_id] = Stay(node_id, Phase.STARTING, job.attempt, indices, now, quantum, pending)
    return Start(job, node_id, indices)


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
