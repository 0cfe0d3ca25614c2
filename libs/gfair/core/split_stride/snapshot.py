"""The snapshot the decision kernel (`gfair.core.kernel`) decides a quantum from: the schedulable
servers grouped into pools, each active user's entitlement and credit per pool
(`gfair.core.accounts`), and the runnable jobs (`SplitStride.runnable`, then as many of each job
array as its limit lets run, `gfair.core.arrays.limit_arrays`) with their speeds
(`ThroughputEstimator.gang_speeds`: the seed table refined by the published profiles), passes,
where they ran, and what a resume and a move cost them (`costs`).

Entitlements are what the trading auction last published when that covers every user with jobs;
otherwise the no-trading shares (`pools.shares`) of the users' tickets and demand (the GPUs of
their admitted, unfinished jobs, less what arrays ask beyond their limits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gfair.core import accounts, arrays, pools
from gfair.core.cluster import generation_rank
from gfair.core.kernel import JobState, PoolState, Snapshot, UserState
from gfair.core.switch_costs import SwitchCosts

from .events import Node
from .residency import Job

if TYPE_CHECKING:
    from .machine import SplitStride


def snapshot(machine: SplitStride, now: float) -> Snapshot:
    """What the kernel decides from at `now` (module doc); users' entitlements are refreshed
    on the way."""
    servers: dict[str, list[Node]] = {}
    for node in machine.schedulable():
        servers.setdefault(node.generation, []).append(node)
    fastest_first = sorted(servers, key=generation_rank, reverse=True)
    pool_states = tuple(
        PoolState(g, tuple(n.server() for n in servers[g]), rank)
        for rank, g in enumerate(fastest_first)
    )
    pool_gpus = {g: sum(n.gpus for n in servers[g]) for g in reversed(fastest_first)}
    _entitle(machine, pool_gpus)
    speeds: dict[tuple[str, str | None, int], dict[str, float]] = {}
    queues: dict[str, list[JobState]] = {}
    members: dict[str, arrays.ArrayMember] = {}
    for key, job in machine.jobs.items():
        if not machine.runnable(job, now):
            continue
        if (member := job.member) is not None:
            members[key] = member
        shape = (job.user, job.job_type, job.gpus)
        if shape not in speeds:
            speeds[shape] = machine.estimator.gang_speeds(
                key, job.user, job.job_type, job.gpus, pool_gpus
            )
        running = tuple(
            node
            for node in job.servers
            if (stay := job.stays.get(node)) is not None
            and stay.holds_gpus
            and stay.attempt == job.attempt
        )
        charged = costs(job, machine.config.operator_costs)
        queues.setdefault(job.user, []).append(
            JobState(
                key,
                job.user,
                job.gpus,
                job.seq,
                speeds[shape],
                job.stride_pass,
                job.weight,
                running=running if len(running) == len(job.servers) else (),
                home=job.servers,
                move_s=charged.migration_s,
                resume_s=charged.resume_s,
            )
        )
    for queue in queues.values():
        queue.sort(key=lambda state: (state.pass_, state.seq))
    overrun, unheld = machine.meter.quanta()
    jobs = arrays.limit_arrays(queues, members) if members else queues
    return Snapshot(pool_states, machine.users, jobs, overrun, unheld, machine.config.quantum_s)


def costs(job: Job, operator: SwitchCosts) -> SwitchCosts:
    """What a resume and a move cost `job` (`MeasuredSwitches.charged`; its own, else the
    `operator`'s, until measured): its resume is in place while its process is parked on its
    node."""
    if job.costs is not None:
        operator = job.costs
    switches = job.switches
    if switches is None:
        return operator
    parked = job.parked is not None
    cached = job.charged
    if cached is not None and cached[0] is switches and cached[1] == parked:
        return cached[2]
    charged = switches.measured.charged(operator, parked=parked)
    job.charged = (switches, parked, charged)
    return charged


def _entitle(machine: SplitStride, pool_gpus: dict[str, int]) -> None:
    demand = accounts.demand((job.user, job.gpus, job.member) for job in machine.jobs.values())
    users = machine.users
    for user in sorted(demand.keys() - users.keys()):
        # Saved before accounts were kept: its users arrive now.
        users[user] = UserState(user, machine.next_seq())
    published = machine.entitlements if machine.entitlements_revision >= 0 else {}
    if demand and all(user in published for user in demand):
        entitled: dict[str, dict[str, float]] = {
            user: {g: float(published[user].get(g, 0.0)) for g in pool_gpus} for user in demand
        }
    else:
        config = machine.config
        tickets = {user: config.tickets_of(user) for user in demand}
        entitled = pools.shares(pool_gpus, tickets, demand, tree=config.shares).entitled
    accounts.entitle([users[name] for name in sorted(users)], entitled, pool_gpus)
