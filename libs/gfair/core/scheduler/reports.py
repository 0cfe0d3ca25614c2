"""What nodes report about a job's processes, folded into the state machine: a start confirmed
(the job holds its GPUs from then on), a process let go (suspended, moved away, or ended)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .events import Exited, Migrated, NodeHealth, Started, Suspended
from .plan import CHANGED, UNCHANGED, Reply
from .residency import Phase, SchedulerJob, Stay

if TYPE_CHECKING:
    from .machine import SplitStride


def confirmed(machine: SplitStride, event: Started) -> bool:
    """The node started the job at `event.at`, bounded by when it was heard of (a node's
    clock ahead of the driver's would give back seconds never lost)."""
    job = machine.jobs.get(event.key)
    if job is None:
        return False
    return started(
        machine, job, event.node_id, event.attempt, event.gpu_indices, event.at, event.now
    )


def started(
    machine: SplitStride,
    job: SchedulerJob,
    node_id: str,
    attempt: int,
    gpu_indices: tuple[int, ...],
    at: float,
    now: float,
) -> bool:
    """`confirmed`, of `job` (a `Started` report's fields, or a start's carried out at once)."""
    node = machine.nodes.get(node_id)
    if node is not None and node.health is NodeHealth.FAILED:
        return False  # reported before the node was declared dead; it died with it
    stay = job.stays.get(node_id)
    if stay is None:
        # A start the machine does not remember asking for: track what really runs.
        machine.reside(job, Stay(node_id, Phase.RUNNING, attempt, gpu_indices, at, machine.quantum))
        return True
    if job.parked_on(node_id):
        machine.park(job, None)  # resumed there, in place or not
    if stay.phase is Phase.STARTING and stay.attempt == attempt:
        stay.phase = Phase.RUNNING  # (it held its GPUs starting too: the job's state is alike)
        machine.changed(job.key)
        # (`SplitStride.pool`, of the node looked up above.)
        pool = node.generation if node is not None else job.generation or "unknown"
        machine.meter.started_late(job, stay, pool, min(at, now))
        return True
    if stay.attempt == attempt and stay.unconfirmed:
        stay.unconfirmed = False  # it did start: its stop will be confirmed in turn
        machine.changed(job.key)
        return True
    return False


def released(machine: SplitStride, event: Suspended | Migrated | Exited) -> Reply:
    """The node stopped the job at `event.at`: a suspend, a migration away, or the process
    ended. A stop's overrun runs to when it was heard of, by the driver's clock like the
    stop's own time (a node's clock ahead of it would charge phantom overruns)."""
    job = machine.jobs.get(event.key)
    if job is None:
        return UNCHANGED
    suspended = isinstance(event, Suspended)
    in_place = isinstance(event, Suspended) and event.in_place
    exited = isinstance(event, Exited) and event.attempt >= job.attempt
    return let_go(
        machine,
        job,
        event.node_id,
        event.now,
        event.at,
        suspended=suspended,
        in_place=in_place,
        exited=exited,
    )


def let_go(
    machine: SplitStride,
    job: SchedulerJob,
    node_id: str,
    now: float,
    at: float,
    *,
    suspended: bool,
    in_place: bool = False,
    exited: bool = False,
) -> Reply:
    """`released`, of `job` on `node_id` (a report's fields, or a stop's carried out at once):
    `suspended` (in place or not), else moved away or ended; `exited`: its process of the
    current attempt (or a later one) ended."""
    stay = job.stays.get(node_id)
    changed = False
    if in_place and stay is not None:
        machine.park(job, (node_id, stay.gpu_indices))
    elif job.parked_on(node_id):
        machine.park(job, None)  # its process there checkpointed and left, or ended
    if exited:
        if stay is None and any(s.holds_gpus for s in job.stays.values()):
            # A copy left where the job no longer runs (its node was declared failed, and
            # the job started elsewhere): the failure detector ignores its end too, so
            # waiting for a verdict would hold the job forever.
            return Reply(False, ignored="exit of a copy elsewhere ignored")
        job.exited = True  # until the failure detector says what becomes of it
        machine.touch(job.key)
        changed = True
    if stay is None:
        return CHANGED if changed else UNCHANGED
    if suspended and stay.phase is Phase.STARTING and stay.pending_suspends == 0:
        # It answers no stop of ours: the node let go of an earlier process of the job (a
        # restarted executor stopped what its predecessor left, parked or running). The start
        # is still to be carried out there, after this report (a node runs a job's commands
        # in order): let go of the stay now and the job could start elsewhere meanwhile.
        return CHANGED
    if suspended and stay.pending_suspends > 0:
        stay.pending_suspends -= 1
        machine.changed(job.key)
        if stay.holds_gpus:
            return CHANGED  # an older suspend; the start sent after it is still in force
    if stay.holds_gpus:
        machine.meter.held(job, stay, machine.pool(job, stay), at)  # it ended mid-quantum
        job.ran(stay, at)
    elif now > stay.since:  # (else it overran by nothing: the common stop heard at once)
        # Held until now, told to stop or not.
        machine.meter.overran(job, stay, machine.pool(job, stay), now)
    machine.unreside(job, node_id)
    return CHANGED
