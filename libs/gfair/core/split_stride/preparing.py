"""Prepared starts: a newly admitted job that opted in (`Admitted.prepare`), fits one server and
did not start at once gets its process started without GPUs on a server where it could run, and
parks there (`Parked`). From then on it is held as parked there on no GPUs in particular
(`Job.parked` with no indices), so the kernel's preference for a job's own server and cheap
in-place resume brings its first slice there; a start elsewhere tells that node to let it go
(`Start.release`), as for any job parked in place."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gfair.core.cluster import generation_rank

from .events import Node
from .plan import Placement, Prepare
from .residency import Job

if TYPE_CHECKING:
    from .machine import SplitStride


def prepare(machine: SplitStride, job: Job) -> tuple[Placement, Prepare] | None:
    """Where `job`, just admitted, starts prepared, if anywhere (module doc)."""
    if job.stays or job.parked is not None:
        return None
    node = _node(machine, job)
    if node is None:
        return None  # fits no server whole, or those are full of waiting processes
    job.servers, job.generation = (node.node_id,), node.generation
    machine.queues.touch(job.key)
    machine.preparing.setdefault(node.node_id, set()).add(job.key)
    return (
        Placement(job.user, job.job_id, job.servers, node.generation),
        Prepare(job.user, job.job_id, job.attempt, node.node_id, node.generation, job.gpus),
    )


def waiting(machine: SplitStride, node_id: str) -> int:
    """How many jobs prepared on `node_id` wait there, not yet given GPUs (forgetting the ones
    that started, moved or ended)."""
    keys = machine.preparing.get(node_id, set())
    for key in list(keys):
        job = machine.jobs.get(key)
        if job is None or job.stays or job.servers != (node_id,):
            keys.discard(key)
    return len(keys)


def _node(machine: SplitStride, job: Job) -> Node | None:
    """Among the servers that take the whole job and have fewer prepared jobs waiting than GPUs
    (a burst of submissions must not start a process per job on one server at once), those of
    the fastest pool its user is entitled to (any pool before entitlements are known), the one
    with the fewest jobs parked on it, then by name; None when there is none."""
    fits = [
        n
        for n in machine.schedulable()
        if n.takes_new_work and n.gpus >= job.gpus and waiting(machine, n.node_id) < n.gpus
    ]
    shares = machine.entitlements.get(job.user, {})
    entitled = [n for n in fits if shares.get(n.generation, 0.0) > 0] or fits
    if not entitled:
        return None
    fastest = max(generation_rank(n.generation) for n in entitled)
    pool = [n for n in entitled if generation_rank(n.generation) == fastest]
    return min(pool, key=lambda n: (len(machine.parked_on(n.node_id)), n.node_id))
