"""Everything the split-stride machine keeps derived from its state for speed, in one place: the
stays on each node and the GPUs they hold, the jobs parked there, the servers' pools and sizes,
each user's jobs and demand, the GPUs promised to held-back jobs, and the kernel's job states and
queues (`Queues`). The machine's transitions change its state (`SplitStride`: jobs, users,
nodes, ...) and tell the index, one method per kind of change; nothing else keeps a cache.
`rebuild` derives an index from the state alone, and a machine made with `check=True` (the tests)
rebuilds it after every input and raises where the kept one answers otherwise (`differences`):
a change the index was not told of shows at the input that made it, not in a later snapshot.
Memos (a user's demand, largest gang, lowest pass) and supersets pruned as they are read (the
residents) are compared by what they answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import attrgetter
from typing import TYPE_CHECKING

from gfair.core import accounts
from gfair.core.kernel import PoolState, RunnableJob

from .events import Node
from .queues import Queues
from .residency import SchedulerJob, Stay
from .snapshot import server_pools

if TYPE_CHECKING:
    from .machine import SplitStride

_NO_STAYS: Mapping[str, Stay] = {}
_STATE = attrgetter(*RunnableJob.__slots__)  # (`astuple` deep-copies: most of a check's cost)


class Index:
    def __init__(
        self, jobs: Mapping[str, SchedulerJob], nodes: Iterable[Node], held_back: Iterable[str]
    ) -> None:
        self.jobs = jobs  # the machine's (read only)
        self.queues = Queues()  # the kernel's job states, made as they are asked (`refresh`)
        self.entitled_for: tuple[object, ...] | None = None  # (`snapshot`: users last entitled)
        # Node -> job key -> its stay there, node -> jobs parked there, node -> GPUs held.
        self.on_node: dict[str, dict[str, Stay]] = {}
        self.parked_at: dict[str, set[str]] = {}
        self.held: dict[str, int] = {}
        self.held_schedulable = 0  # GPUs held on schedulable servers
        self.set_nodes(tuple(nodes))
        # Jobs that may hold residencies (pruned as it is read), and each user's jobs in
        # arrival order: an admission reads what runs and what the user has, not the backlog.
        self.residents: set[str] = set()
        self.of_user: dict[str, dict[str, None]] = {}
        self.min_pass: dict[str, float] = {}  # a user's lowest job pass, until passes change
        # Each user's demand and largest gang until its jobs change; every user's until any do.
        self.gangs: dict[str, tuple[float, float]] = {}
        self.kept_demand: dict[str, float] | None = None
        self.kept_ceilings: dict[str, float] | None = None
        # Node -> the held-back jobs placed on it (asked for every server a fill tries); back.
        self.promised_on: dict[str, dict[str, None]] = {}
        self.promised_by: dict[str, tuple[str, ...]] = {}
        for key, job in jobs.items():
            self.of_user.setdefault(job.user, {})[key] = None
            for stay in job.stays.values():
                self.resided(key, None, stay)
            if job.parked is not None:
                self.parked_at.setdefault(job.parked[0], set()).add(key)
        for key in held_back:
            self.promise(key, True)

    # -- told of changes ----------------------------------------------------------------------

    def set_nodes(self, nodes: tuple[Node, ...]) -> None:
        """The servers are `nodes` now."""
        self.schedulable = sorted((n for n in nodes if n.schedulable), key=lambda n: n.node_id)
        self.pools: tuple[tuple[PoolState, ...], dict[str, int]] = server_pools(self.schedulable)
        self.sizes = {node.node_id: node.gpus for node in nodes}
        self.generations = {node.node_id: node.generation for node in nodes}
        self.names = frozenset(node.node_id for node in self.schedulable)
        self.gpus_schedulable = sum(node.gpus for node in self.schedulable)
        self.held_schedulable = sum(self.held.get(name, 0) for name in self.names)

    def jobs_changed(self, user: str, *, first_changed: bool) -> None:
        """`user`'s jobs came or went (`first_changed`: its earliest one went, and it has
        others): its demand and largest gang are found again, and in the users' `demand` and
        `ceilings` (made anew, never changed in place: `entitled_for` holds the last) it takes
        its new values, or leaves, or comes last (its first job is the latest to arrive), or,
        when its place among the users may have changed, they are all found again."""
        self.gangs.pop(user, None)
        gang = self.gang(user) if self.of_user.get(user) else None
        if self.kept_demand is not None:
            self.kept_demand = None if first_changed else _with(self.kept_demand, user, gang, 0)
        if self.kept_ceilings is not None:
            self.kept_ceilings = _with(self.kept_ceilings, user, gang, 1)

    def resided(self, key: str, old: Stay | None, stay: Stay | None) -> None:
        """`key`'s stay `old` (None: none) is replaced by `stay` (None: dropped)."""
        if old is not None:
            here = self.on_node[old.node_id]
            del here[key]
            if not here:
                del self.on_node[old.node_id]
            if old.holds_gpus:
                self.hold(old.node_id, -len(old.gpu_indices))
        if stay is not None:
            self.residents.add(key)
            self.on_node.setdefault(stay.node_id, {})[key] = stay
            if stay.holds_gpus:
                self.hold(stay.node_id, len(stay.gpu_indices))

    def hold(self, node_id: str, gpus: int) -> None:
        self.held[node_id] = self.held.get(node_id, 0) + gpus
        if node_id in self.names:
            self.held_schedulable += gpus

    def parked(self, key: str, was: str | None, where: str | None) -> None:
        """`key`, parked on node `was` (None: nowhere), is parked on `where` now."""
        if was is not None:
            self.parked_at[was].discard(key)
        if where is not None:
            self.parked_at.setdefault(where, set()).add(key)

    def promise(self, key: str, held_back: bool) -> None:
        """Promise `key`'s servers to it while it is `held_back`, and no others."""
        for server in self.promised_by.pop(key, ()):
            promised = self.promised_on[server]
            del promised[key]
            if not promised:
                del self.promised_on[server]
        job = self.jobs.get(key)
        if held_back and job is not None and job.servers:
            self.promised_by[key] = job.servers
            for server in job.servers:
                self.promised_on.setdefault(server, {})[key] = None

    # -- questions ----------------------------------------------------------------------------

    def gang(self, user: str) -> tuple[float, float]:
        """`user`'s demand (`accounts.demand`) and largest gang (`accounts.ceiling`)."""
        found = self.gangs.get(user)
        if found is None:
            mine = [self.jobs[key] for key in self.of_user[user]]
            asked = accounts.demand((job.user, job.gpus, job.member) for job in mine)
            found = self.gangs[user] = asked[user], accounts.ceiling(job.gpus for job in mine)
        return found

    def demand(self) -> dict[str, float]:
        """User -> GPUs its admitted, unfinished jobs ask (`accounts.demand`), the users in the
        order of their earliest job's arrival (kept until jobs come or go: read it, never
        change it)."""
        if self.kept_demand is None:
            first = sorted(
                (self.jobs[next(iter(keys))].seq, user)
                for user, keys in self.of_user.items()
                if keys
            )
            self.kept_demand = {user: self.gang(user)[0] for _, user in first}
        return self.kept_demand

    def ceilings(self) -> dict[str, float]:
        """User -> what its credit may save up for (`accounts.ceiling`: its largest gang)."""
        if self.kept_ceilings is None:
            self.kept_ceilings = {user: self.gang(user)[1] for user in self.demand()}
        return self.kept_ceilings

    def joining_pass(self, user: str) -> float:
        """The pass a new job of `user` joins at (`accounts.joining_pass`)."""
        found = self.min_pass.get(user)
        if found is None:
            passes = (self.jobs[k].stride_pass for k in self.of_user.get(user, ()))
            found = self.min_pass[user] = accounts.joining_pass(passes)
        return found

    def resident_jobs(self) -> list[SchedulerJob]:
        """The jobs with residencies."""
        found: list[SchedulerJob] = []
        for key in list(self.residents):
            job = self.jobs.get(key)
            if job is None or not job.stays:
                self.residents.discard(key)
            else:
                found.append(job)
        return found

    def stays_on(self, node_id: str) -> Mapping[str, Stay]:
        """Job key -> its residency on `node_id`, for every job resident there (read it, never
        change it)."""
        return self.on_node.get(node_id, _NO_STAYS)

    def free_indices(self, node: Node | None) -> list[int]:
        if node is None:
            return []
        here = self.on_node.get(node.node_id)
        if not here:
            return list(node.gpu_indices)
        held = [i for stay in here.values() if stay.holds_gpus for i in stay.gpu_indices]
        return [i for i in node.gpu_indices if i not in held]

    def parked_on(self, node_id: str) -> dict[str, tuple[int, ...]]:
        """Job key -> GPU indices, for the jobs parked in place on `node_id` that hold no GPUs
        now."""
        found: dict[str, tuple[int, ...]] = {}
        for key in self.parked_at.get(node_id, ()):
            job = self.jobs[key]
            if not job.stays and job.parked is not None:
                found[key] = job.parked[1]
        return found

    def promised(self, node_id: str) -> int:
        """GPUs of `node_id` promised to held-back jobs."""
        jobs, sizes = self.jobs, self.sizes
        return sum(jobs[key].gpus_on(node_id, sizes) for key in self.promised_on.get(node_id, ()))

    def free_gpus(self) -> int:
        """GPUs of the schedulable servers that no job holds."""
        return self.gpus_schedulable - self.held_schedulable


def rebuild(machine: SplitStride) -> Index:
    """An index derived from `machine`'s state alone."""
    return Index(machine.jobs, machine.nodes.values(), machine.held_back)


def differences(kept: Index, fresh: Index, machine: SplitStride, now: float) -> list[str]:
    """Where `kept` answers otherwise than `fresh` (`rebuild`), kernel states as of `now` too."""
    mine, derived = (_answers(index, machine, now) for index in (kept, fresh))
    return [
        f"{part}: kept {mine.get(part)!r}, derived {derived.get(part)!r}"
        for part in sorted(mine.keys() | derived.keys())
        if mine.get(part) != derived.get(part)
    ]


def _answers(index: Index, machine: SplitStride, now: float) -> dict[str, object]:
    """What `index` answers, part by part (each kernel state a part of its own); memos and
    supersets by what they answer."""
    made = index.queues.refresh(machine, now, index.pools[1])
    users = [user for user, keys in index.of_user.items() if keys]
    parts = ("schedulable", "sizes", "generations", "names", "pools", "gpus_schedulable")
    found: dict[str, object] = {part: getattr(index, part) for part in parts}
    found.update({f"kernel state of {s.id}": _STATE(s) for q in made.values() for s in q})
    return found | {
        "held_schedulable": index.held_schedulable,
        "held": {node: gpus for node, gpus in index.held.items() if gpus},
        "on_node": index.on_node,
        "parked_at": {node: keys for node, keys in index.parked_at.items() if keys},
        "residents": {job.key for job in index.resident_jobs()},
        "of_user": {user: list(index.of_user[user]) for user in users},
        "gangs": {user: index.gang(user) for user in users},
        "joining passes": {user: index.joining_pass(user) for user in users},
        "demand": list(index.demand().items()),
        "ceilings": index.ceilings(),
        "promised": {node: set(keys) for node, keys in index.promised_on.items() if keys},
        "promised_by": index.promised_by,
        "queues": [(user, [state.id for state in queue]) for user, queue in made.items()],
        "running": sorted(state.id for state in index.queues.running()),
        "least waiting": index.queues.least_waiting(),
        "in arrays": index.queues.in_arrays(),
    }


def _with(
    kept: dict[str, float], user: str, gang: tuple[float, float] | None, part: int
) -> dict[str, float]:
    """A copy of `kept` (user -> a part of its gang: `Index.demand`, `ceilings`) with `user`'s
    part of `gang`, or without `user` (None: it has no jobs left)."""
    found = dict(kept)
    if gang is None:
        found.pop(user, None)
    else:
        found[user] = gang[part]
    return found
