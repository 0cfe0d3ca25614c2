"""Prepared starts: a newly admitted job that opted in (`Admitted.prepare`), fits one server and
did not start at once gets its process started without GPUs on a server where it could run, and
parks there (`Parked`). It is given no GPUs until then (or until `SchedulerConfig.prepared_wait_s`
passed: a process that never parks), so its first slice is not spent importing. From then on
it is held as parked there on no GPUs in particular (`SchedulerJob.parked` with no indices), so the
kernel's preference for a job's own server and cheap in-place resume brings its first slice
there; a start elsewhere tells that node to let it go (`Start.release`), as for any job parked
in place.

Such a job whose slice ends while it still comes up (its import or checkpoint load outlasts the
slice: `Suspended.starting`) would begin anew at every slice and never train; it is prepared
again instead, on the server it was on. Only once until it is seen to come up (it parks, or a
later slice ends past its start-up): a process that never parks would otherwise hold up every
slice's start on its node for as long as a resume may take."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gfair.core.cluster import generation_rank

from .events import Node, Suspended
from .plan import Placement, Prepare
from .residency import SchedulerJob

if TYPE_CHECKING:
    from .machine import SplitStride


def prepare(
    machine: SplitStride, job: SchedulerJob, now: float, near: str | None = None
) -> tuple[Placement, Prepare] | None:
    """Where `job` starts prepared at `now`, if anywhere (module doc): on `near` when it can."""
    if job.stays or job.parked is not None:
        return None
    node = _node(machine, job, near)
    if node is None:
        return None  # fits no server whole, or those are full of waiting processes
    job.servers, job.generation = (node.node_id,), node.generation
    job.coming_up_until = now + machine.config.prepared_wait_s
    machine.touch(job.key)
    machine.preparing.setdefault(node.node_id, set()).add(job.key)
    return (
        Placement(job.user, job.job_id, job.servers, node.generation),
        Prepare(job.user, job.job_id, job.attempt, node.node_id, node.generation, job.gpus),
    )


def came_up(machine: SplitStride, job: SchedulerJob) -> bool:
    """A process of `job` was let go past its start-up (so it may be prepared again another
    time), or its prepared process was let go (it waits for none): whether it was waiting for
    one."""
    if job.prepared_unproven:
        job.prepared_unproven = False
        machine.touch(job.key)
    if job.coming_up_until is None:
        return False
    job.coming_up_until = None
    machine.touch(job.key)
    return True


def after_start_up(
    machine: SplitStride, job: SchedulerJob, event: Suspended
) -> tuple[Placement, Prepare] | None:
    """Whether `job`, forced off by `event` while it came up and not started again since,
    starts prepared on that node (module doc)."""
    if not job.prepare or job.prepared_unproven or job.exited:
        return None
    prepared = prepare(machine, job, event.now, near=event.node_id)
    job.prepared_unproven = prepared is not None
    return prepared


def waits_prepared(job: SchedulerJob) -> bool:
    """Whether `job`'s prepared process waits on its server for GPUs: coming up, or parked on
    none in particular (a restored machine's `preparing` is made of these)."""
    prepared = job.coming_up_until is not None or (job.parked is not None and not job.parked[1])
    return prepared and not job.stays and len(job.servers) == 1


def waiting(machine: SplitStride, node_id: str) -> int:
    """How many jobs prepared on `node_id` wait there, not yet given GPUs (forgetting the ones
    that started, moved or ended)."""
    keys = machine.preparing.get(node_id, set())
    for key in list(keys):
        job = machine.jobs.get(key)
        if job is None or job.stays or job.servers != (node_id,):
            keys.discard(key)
    return len(keys)


def _node(machine: SplitStride, job: SchedulerJob, near: str | None) -> Node | None:
    """Among the servers that take the whole job and have fewer prepared jobs waiting than GPUs
    (a burst of submissions must not start a process per job on one server at once): `near`,
    else those of the fastest pool its user is entitled to (any pool before entitlements are
    known), the one with the fewest jobs parked on it, then by name; None when there is none."""
    fits = [
        n
        for n in machine.index.schedulable
        if n.takes_new_work and n.gpus >= job.gpus and waiting(machine, n.node_id) < n.gpus
    ]
    for node in fits:
        if node.node_id == near:
            return node
    shares = machine.entitlements.get(job.user, {})
    entitled = [n for n in fits if shares.get(n.generation, 0.0) > 0] or fits
    if not entitled:
        return None
    fastest = max(generation_rank(n.generation) for n in entitled)
    pool = [n for n in entitled if generation_rank(n.generation) == fastest]
    return min(pool, key=lambda n: (len(machine.index.parked_on(n.node_id)), n.node_id))
