"""Job arrays' limits: at most N of an array's jobs run in a quantum (Slurm's ``--array=...%N``).

An array is a set of one user's jobs sharing an array key (the drivers make the key from the
user and the array id, so no user can join, or throttle, another user's array). Each member may
name a limit; the array's limit is the smallest its runnable members name, so a member can only
lower it, and no field a tenant sets can raise anyone's share.

The rule is applied where the kernel's snapshot is built (split-stride's state machine), as a
filter on each user's runnable jobs:

- `limit_arrays`: of each limited array, at most `limit` members stay runnable this quantum:
  first those that ran last quantum (a running member keeps its slot, as in Slurm, where an
  array task runs to its end), then the others in the user's own order (pass, then arrival).
  The other members are left out of the snapshot, so the kernel can never run more than
  `limit` of them, and a quantum in which only they wait counts as one where nobody waits.
- `excess_demand`: the GPUs an array's members ask beyond what `limit` of them can hold at once
  (its largest `limit` gangs). `accounts.demand` subtracts it from the user's demand, so the user's
  entitlement is not water-filled for work it has capped itself out of running.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gfair.core.kernel import RunnableJob


@dataclass(frozen=True, slots=True)
class ArrayMember:
    """A job's array key and the limit it names (None: no limit)."""

    array: str
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"array {self.array}: limit must be >= 1, got {self.limit}")


def array_key(user: str, array_id: str) -> str:
    """The key that groups an array's members: an array belongs to one user."""
    return f"{user}/{array_id}"


def limits(members: Iterable[ArrayMember]) -> dict[str, int]:
    """Array key -> its limit: the smallest one its members name (arrays with none left out)."""
    found: dict[str, int] = {}
    for member in members:
        if member.limit is not None:
            found[member.array] = min(found.get(member.array, member.limit), member.limit)
    return found


def limit_arrays(
    jobs: Mapping[str, Sequence[RunnableJob]], members: Mapping[str, ArrayMember]
) -> dict[str, Sequence[RunnableJob]]:
    """Each user's runnable jobs with every limited array cut down to its limit (module doc).

    `jobs` is the snapshot's user -> jobs in the user's order; `members` maps a job id to its
    array membership (jobs of no array are absent). A user's list is returned as it came when
    none of its jobs is in a limited array.
    """
    out: dict[str, Sequence[RunnableJob]] = {}
    for user, queue in jobs.items():
        mine = [members[job.id] for job in queue if job.id in members]
        caps = limits(mine)
        if not caps:
            out[user] = queue
            continue
        kept: set[str] = set()
        taken: dict[str, int] = {}
        # Two passes over the user's order: members that hold GPUs first, then the rest.
        for running_first in (True, False):
            for job in queue:
                member = members.get(job.id)
                if member is None or member.array not in caps or job.id in kept:
                    continue
                if bool(job.running) != running_first:
                    continue
                if taken.get(member.array, 0) < caps[member.array]:
                    taken[member.array] = taken.get(member.array, 0) + 1
                    kept.add(job.id)
        out[user] = [
            job
            for job in queue
            if job.id in kept or (m := members.get(job.id)) is None or m.array not in caps
        ]
    return out


def excess_demand(jobs: Iterable[tuple[int, ArrayMember | None]]) -> int:
    """GPUs asked by limited arrays' members beyond their limits' largest gangs.

    `jobs` is (GPUs, membership) per unfinished job of one user (membership None outside
    arrays). For each limited array, the GPUs of all its members less those of its `limit`
    largest: what it can never hold at once.
    """
    gangs: dict[str, list[int]] = {}
    members: list[ArrayMember] = []
    for gpus, member in jobs:
        if member is not None:
            gangs.setdefault(member.array, []).append(gpus)
            members.append(member)
    excess = 0
    for array, cap in limits(members).items():
        sizes = sorted(gangs[array], reverse=True)
        excess += sum(sizes[cap:])
    return excess
