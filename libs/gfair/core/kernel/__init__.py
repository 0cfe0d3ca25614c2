"""The decision kernel: one quantum's runs, from a snapshot (docs/design.md §2.7).

`decide` is a pure function. It reads a `Snapshot` (pools and their servers, each active user's
entitlement and credit per pool, each runnable job with its speeds and where it ran) and returns
a `Decision` (which jobs run on which servers this quantum, the GPUs each user was charged per
pool, and which pass chose each job). The simulator's policy and the live services only build
snapshots and carry decisions out; `settle` then books the charges into the credits the next
snapshot carries. Nothing here reads a clock or draws a random number; charges are in
GPU-quanta.

A decision runs these passes over one `Cycle` (`cycle`), in order; each module's docstring is
its rule:

1-2. `stride`: the stride over users' entitlements, per pool, jobs free of pools (rules 1, 2);
3. `surplus`: idle GPUs to the waiting jobs, uncharged (rule 3);
   `keep_pools`: a user's chosen jobs of one size keep the pools they ran in (rule 2);
4. `fast_first`: idle faster GPUs take the jobs that gain from them, then `surplus` again;
5. `affinity`: each pool packed again, jobs staying where they ran, then `surplus` again;
7. `fastest`: when nobody waits, the fastest pools to the jobs that gain most there;
8. `moves`: every move above is made only when it pays.
6. `backfilling` (`backfill`) places waiting jobs between quanta; `settling` (`settle`) books a
   quantum. A gang's tentative placement is a `statement.Statement`.
"""

from __future__ import annotations

from collections import defaultdict

from .affinity import affinity
from .backfilling import backfill
from .cycle import (
    DEFAULT_QUANTUM_S,
    USER,
    Cycle,
    Decision,
    Pass,
    PoolState,
    RunnableJob,
    Snapshot,
    UserState,
)
from .fast_first import fast_first
from .fastest import fastest_to_fastest
from .keep_pools import keep_pools
from .settling import settle
from .stride import entitled_runs
from .surplus import surplus_runs

__all__ = [
    "DEFAULT_QUANTUM_S",
    "Decision",
    "Pass",
    "PoolState",
    "RunnableJob",
    "Snapshot",
    "UserState",
    "backfill",
    "decide",
    "settle",
]


def decide(snapshot: Snapshot) -> Decision:
    """One quantum's decision: the passes in order (module doc)."""
    cycle = Cycle(snapshot)
    entitled_runs(cycle)
    entitled = frozenset(cycle.chosen)
    surplus_runs(cycle)
    keep_pools(cycle)
    if fast_first(cycle):  # moves may have freed room a gang can use
        surplus_runs(cycle)
    affinity(cycle)
    surplus_runs(cycle)  # what packing freed
    waiting = sum(len(jobs) for jobs in cycle.order.values()) - len(cycle.chosen)
    if waiting == 0:
        fastest_to_fastest(cycle)
    chosen = cycle.chosen
    placed = {job_id: choice.servers for job_id, choice in chosen.items()}
    runs: defaultdict[str, list[str]] = defaultdict(list)
    for job_id, servers in placed.items():
        for server_id in servers:
            runs[server_id].append(job_id)
    return Decision(
        runs={s: tuple(jobs) for s, jobs in runs.items()},
        placed=placed,
        charged=cycle.charged,
        waiting=waiting,
        idle={generation: free.total for generation, free in cycle.packing.items() if free.total},
        served=frozenset(map(USER, chosen.values())),
        entitled=entitled,
        chosen_by=cycle.chosen_by,
    )
