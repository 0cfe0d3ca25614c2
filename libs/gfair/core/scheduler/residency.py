"""What the state machine knows of a job: its residencies ("stays", where it was told to run
and has not yet let go) and the record of the job itself.

A stay that is starting or running holds its GPU indices (a GPU is never in two stays); a
suspending one holds no GPU on its node (a node executor runs its commands in order, so a start
sent after the suspend finds the GPUs free) but keeps the job from starting anywhere else until
the node confirms it let go: a job never runs twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import TYPE_CHECKING

from gfair.core import arrays
from gfair.core.switch_costs import MeasuredSwitches, SwitchCosts

if TYPE_CHECKING:
    from .events import Launch


def job_key(user: str, job_id: str) -> str:
    return f"{user}.{job_id}"


def duration(seconds: float) -> str:
    """`seconds` as a person writes it: 45s, 1m30s, 4h, 4h00m12s, 2d03h."""
    left, text = round(seconds), ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, left = divmod(left, size)
        if count or (text and left):
            text += f"{count:02d}{unit}" if text else f"{count}{unit}"
        if text and not left:
            break
    return text or "0s"


class Phase(StrEnum):
    STARTING = "starting"  # a start was sent
    RUNNING = "running"  # the node said it started (or resumed)
    SUSPENDING = "suspending"  # a suspend was sent; the node has not confirmed it yet


@dataclass(slots=True)
class Stay:
    """Where the job was told to run (times in seconds since the epoch)."""

    node_id: str
    phase: Phase
    attempt: int
    gpu_indices: tuple[int, ...]
    since: float
    quantum: int
    pending_suspends: int = 0
    # Stopped while its start was still unconfirmed. The node processes commands in order, so
    # if it ran the start, `started` comes before any answer to the stop; if it refused the
    # start (it read the start past its `Start.valid_until`) nothing comes at all, not even
    # for the stop. Such a stop is forgotten after `unconfirmed_release_s`, not the long
    # `release_timeout_s`; persisted, so a reload after a failed write (a broker lost) does
    # not hold the job back for the long timeout.
    unconfirmed: bool = False

    @property
    def holds_gpus(self) -> bool:
        # Starting or running; a suspending job's GPUs are its own until its node confirms.
        return self.phase is not Phase.SUSPENDING

    def values(self) -> tuple[object, ...]:
        return (
            self.node_id,
            self.phase,
            self.attempt,
            self.gpu_indices,
            self.since,
            self.quantum,
            self.pending_suspends,
            self.unconfirmed,
        )


@dataclass(frozen=True, slots=True)
class Switches:
    """A job's switches as last measured (`reports`: how many switch reports they fold in; a
    later estimate has more)."""

    reports: int
    measured: MeasuredSwitches


@dataclass
class SchedulerJob:
    user: str
    job_id: str
    gpus: int
    weight: float
    job_type: str | None
    seq: int  # arrival order
    stride_pass: float = 0.0
    generation: str | None = None
    servers: tuple[str, ...] = ()  # where the kernel last placed it
    attempt: int = 1
    runnable_at: float | None = None
    exited: bool = False
    stays: dict[str, Stay] = field(default_factory=dict)
    array: str | None = None  # its job array's id (the user's), if any
    array_limit: int | None = None
    switches: Switches | None = None
    prepare: bool = False  # it opted in to prepared starts (`Admitted.prepare`)
    launch: Launch | None = None  # what its start needs, for the driver (`Admitted.launch`)
    ran_s: float = 0.0  # running time (holding GPUs, confirmed) of its runs ended so far
    # Its own costs until measured (`Admitted.costs`; None: the operator's). Not persisted: only
    # the simulator's jobs give their own.
    costs: SwitchCosts | None = field(default=None, compare=False)
    # The costs last worked out for these switches, parked or not: a snapshot reads them for
    # every runnable job every quantum.
    charged: tuple[Switches, bool, SwitchCosts] | None = field(default=None, compare=False)
    # Where its process is parked in place (its node said its last suspend was in place, or
    # its prepared start parked): the node and GPU indices it resumes on without a checkpoint
    # (none in particular for a prepared start). Persisted, as the two below: the process
    # outlives a restart of the machine's driver.
    parked: tuple[str, tuple[int, ...]] | None = field(default=None, compare=False)
    # A prepared start it was given after a slice ended while it still came up, not yet seen
    # to come up (`preparing.after_start_up`).
    prepared_unproven: bool = field(default=False, compare=False)
    # Until then it waits for its prepared start to park before it is given GPUs (its slice
    # would otherwise be spent on its start-up).
    coming_up_until: float | None = field(default=None, compare=False)

    @cached_property
    def key(self) -> str:
        # (Read at every turn of the machine; a job's user and id never change.)
        return job_key(self.user, self.job_id)

    @property
    def waits_until(self) -> float | None:
        """Until when it may not run: a retry's delay, or a wait for its prepared process."""
        retry, coming_up = self.runnable_at, self.coming_up_until
        if retry is None or coming_up is None:
            return coming_up if retry is None else retry
        return max(retry, coming_up)

    @property
    def member(self) -> arrays.ArrayMember | None:
        if self.array is None:
            return None
        return arrays.ArrayMember(arrays.array_key(self.user, self.array), self.array_limit)

    def signature(self) -> tuple[object, ...]:
        """Everything persisted about the job that changes, to tell whether it changed."""
        return (
            self.servers,
            self.generation,
            self.attempt,
            self.runnable_at,
            self.exited,
            self.stride_pass,
            tuple(s.values() for s in self.stays.values()),
            self.switches,
            self.ran_s,
        )

    def ran(self, stay: Stay, until: float) -> None:
        """`stay`'s run ends at `until`: its running time joins `ran_s` (a gang's part, by its
        share of the job's GPUs, so that a gang's parts add up to the gang's time)."""
        if stay.phase is Phase.RUNNING and until > stay.since:
            self.ran_s += (until - stay.since) * len(stay.gpu_indices) / self.gpus

    def running_s(self, now: float) -> float:
        """How long it has run on GPUs up to `now`: waiting and time-sliced out do not count,
        nor a start until its node confirmed it."""
        running = sum(
            (now - s.since) * len(s.gpu_indices)
            for s in self.stays.values()
            if s.phase is Phase.RUNNING
        )
        return self.ran_s + max(0.0, running) / self.gpus

    def parked_on(self, node_id: str) -> bool:
        return self.parked is not None and self.parked[0] == node_id

    def gpus_on(self, server_id: str, sizes: dict[str, int]) -> int:
        """GPUs the gang uses on `server_id`: spread as evenly as the servers allow."""
        if len(self.servers) == 1:
            return self.gpus
        left = self.gpus
        order = sorted(self.servers, key=lambda s: (sizes.get(s, 0), self.servers.index(s)))
        for position, server in enumerate(order):
            share = min(sizes.get(server, 0), -(-left // (len(order) - position)))
            if server == server_id:
                return share
            left -= share
        return 0
