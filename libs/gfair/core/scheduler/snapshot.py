"""The snapshot the decision kernel (`gfair.core.kernel`) decides a quantum from: the schedulable
servers grouped into pools, each active user's entitlement and credit per pool
(`gfair.core.accounts`), and the runnable jobs (`SplitStride.runnable`, then as many of each job
array as its limit lets run, `gfair.core.arrays.limit_arrays`) with their speeds
(`ThroughputEstimator.gang_speeds`: the seed table refined by the published profiles), passes,
where they ran, and what a resume and a move cost them (`costs`). The pools are made when the
servers change, the job states kept by the machine's queues (`queues`) as its jobs change, and
each user's demand as its jobs come and go, so a snapshot costs what changed since the last.

Entitlements are what the trading auction last published when that covers every user with jobs;
otherwise the no-trading shares (`pools.shares`) of the users' tickets and demand (the GPUs of
their admitted, unfinished jobs, less what arrays ask beyond their limits).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gfair.core import accounts, arrays, pools
from gfair.core.cluster import generation_rank
from gfair.core.kernel import PoolState, RunnableJob, Snapshot, UserState
from gfair.core.switch_costs import SwitchCosts

from .events import Node
from .residency import SchedulerJob

if TYPE_CHECKING:
    from .machine import SplitStride


def snapshot(machine: SplitStride, now: float, *, entitle: bool = True) -> Snapshot:
    """What the kernel decides from at `now` (module doc); users' entitlements are refreshed
    on the way unless `entitle` is False (then they are as the last refresh left them). The job
    states and queues are the machine's queues' own (`queues`), kept up to date: the snapshot
    is read at once, before the next input changes them."""
    index = machine.index
    pool_states, pool_gpus = index.pools
    if entitle:
        _entitle(machine, pool_gpus)
    queues = index.queues.refresh(machine, now, pool_gpus)
    if in_arrays := index.queues.in_arrays():
        limited = dict(queues)
        # Only the queues with array members are cut (`limit_arrays` keeps the others).
        members = {
            key: member
            for keys in in_arrays.values()
            for key in keys
            if (member := machine.jobs[key].member) is not None
        }
        cut = arrays.limit_arrays({user: queues[user] for user in in_arrays}, members)
        limited.update((user, tuple(queue)) for user, queue in cut.items())
        queues = limited
    overrun, unheld = machine.meter.quanta()
    return Snapshot(pool_states, machine.users, queues, overrun, unheld, machine.config.quantum_s)


def server_pools(schedulable: Sequence[Node]) -> tuple[tuple[PoolState, ...], dict[str, int]]:
    """The pools of the `schedulable` servers, fastest first, and their GPUs, slowest first."""
    servers: dict[str, list[Node]] = {}
    for node in schedulable:
        servers.setdefault(node.generation, []).append(node)
    fastest_first = sorted(servers, key=generation_rank, reverse=True)
    pool_states = tuple(
        PoolState(g, tuple(n.server() for n in servers[g]), rank)
        for rank, g in enumerate(fastest_first)
    )
    pool_gpus = {g: sum(n.gpus for n in servers[g]) for g in reversed(fastest_first)}
    return pool_states, pool_gpus


def job_state(job: SchedulerJob, speeds: dict[str, float], operator: SwitchCosts) -> RunnableJob:
    """A runnable `job` as the kernel sees it, running only where its whole gang holds GPUs in
    its current attempt."""
    state = RunnableJob(job.key, job.user, job.gpus, job.seq, speeds)
    restate(state, job, speeds, operator)
    return state


def restate(
    state: RunnableJob, job: SchedulerJob, speeds: dict[str, float], operator: SwitchCosts
) -> None:
    """Bring `state`, made by `job_state` for `job`, up to date with it (what `job_state` would
    make now; a job's key, user, GPUs and arrival never change)."""
    charged = costs(job, operator)
    state.speeds = speeds
    state.pass_ = job.stride_pass
    state.weight = job.weight
    state.running = _running(job)
    state.home = job.servers
    state.move_s = charged.migration_s
    state.resume_s = charged.resume_s


def _running(job: SchedulerJob) -> tuple[str, ...]:
    """The job's servers when its whole gang holds GPUs there in its current attempt, else
    none."""
    servers = job.servers
    stays = job.stays
    for node in servers:
        stay = stays.get(node)
        if stay is None or not stay.holds_gpus or stay.attempt != job.attempt:
            return ()
    return servers


def costs(job: SchedulerJob, operator: SwitchCosts) -> SwitchCosts:
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
    index = machine.index
    demand = index.demand()
    users = machine.users
    # The same users (`entitled_for` is forgotten as users come and go), demand, pools and
    # published shares as when last entitled: each user is entitled as it is (`entitle` again
    # would give each the same and find no newcomer to a pool).
    # (The machine's own demand and pools, kept until they change: compared by identity first,
    # they cost nothing to compare when they did not.)
    key = (machine.entitlements_revision, demand, pool_gpus)
    if key == index.entitled_for:
        return  # (every user with demand had an account then, and none left since)
    for user in sorted(demand.keys() - users.keys()):
        # Saved before accounts were kept: its users arrive now.
        users[user] = UserState(user, machine.next_seq())
    index.entitled_for = key
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
