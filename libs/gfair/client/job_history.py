"""What the recorded events say happened: each job's end, and who held which GPU when.

Everything here reads the `GFAIR_JOBS` stream history (the source of truth, docs/design.md
§3.3), not the services' own records, so a service that got its state wrong cannot also hide it.
The reliability tests judge by it, and `bench.scale` counts with it the jobs lost, duplicated
and GPUs double-booked at the end of a run.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from gfair.bus.transport import Bus
from gfair.events.codec import DecodedEvent, decode
from gfair.events.errors import InvalidEvent
from gfair.events.jobs import (
    JobCancelled,
    JobCompleted,
    JobEvent,
    JobExited,
    JobFailed,
    JobMigrated,
    JobRejected,
    JobResumed,
    JobRetried,
    JobStarted,
    JobSuspended,
)
from gfair.events.subjects import JOBS_STREAM
from gfair.events.submission import JobSubmitted

TERMINAL = (JobCompleted, JobFailed, JobCancelled, JobRejected)
Job = tuple[str, str]  # (user, job id)


# What a replay needs: submissions, where runs started and stopped, and how jobs ended; not
# the progress, checkpoint and output reports, which outnumber the rest on a large cluster.
REPLAYED: tuple[type[JobEvent], ...] = (
    JobSubmitted,
    JobStarted,
    JobResumed,
    JobSuspended,
    JobMigrated,
    JobExited,
    JobRetried,
    *TERMINAL,
)


async def job_history(bus: Bus, *, only: tuple[type[JobEvent], ...] = ()) -> list[DecodedEvent]:
    """Every decodable event of `GFAIR_JOBS`, in stream order; with `only`, of those types
    (filtered by the broker, by subject)."""
    events = []
    subjects = tuple(kind.subject_pattern() for kind in only)
    async for message in bus.history(JOBS_STREAM.name, filter_subjects=subjects):
        try:
            events.append(decode(message.data, subject=message.subject))
        except InvalidEvent:
            continue  # poison submissions are the fuzz tests' business
    return events


@dataclass
class Outcomes:
    """Per job: how often it was submitted, its terminal events, its retries."""

    submitted: dict[Job, int] = field(default_factory=lambda: defaultdict(int))
    terminal: dict[Job, list[JobEvent]] = field(default_factory=lambda: defaultdict(list))
    retries: dict[Job, list[JobRetried]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def of(cls, events: list[DecodedEvent]) -> Outcomes:
        found = cls()
        for event in events:
            data = event.data
            if not isinstance(data, JobEvent):
                continue
            job = (data.user, data.job_id)
            if isinstance(data, JobSubmitted):
                found.submitted[job] += 1
            elif isinstance(data, TERMINAL):
                found.terminal[job].append(data)
            elif isinstance(data, JobRetried):
                found.retries[job].append(data)
        return found

    def problems(self, expected: set[Job]) -> list[str]:
        """Jobs lost (no end), ended twice, or never submitted; empty when all is well."""
        found = []
        for job in sorted(expected):
            ends = self.terminal.get(job, [])
            if len(ends) != 1:
                kinds = [type(e).__name__ for e in ends]
                found.append(f"{job[0]}/{job[1]}: {len(ends)} terminal events {kinds}")
        strangers = set(self.terminal) - expected
        found += [f"{u}/{j}: ended but never submitted by the test" for u, j in sorted(strangers)]
        return found

    def end(self, job: Job) -> JobEvent:
        (only,) = self.terminal[job]
        return only


def most_nodes_at_once(events: list[DecodedEvent]) -> dict[Job, int]:
    """Per job, the most nodes it held GPUs on at the same time (a job run twice shows 2).

    Only meaningful for jobs that fit one server; a gang across servers holds several.
    """
    on: dict[Job, set[str]] = defaultdict(set)
    most: dict[Job, int] = defaultdict(int)
    for event in events:
        data = event.data
        if isinstance(data, JobStarted | JobResumed):
            job = (data.user, data.job_id)
            on[job].add(data.node_id)
            most[job] = max(most[job], len(on[job]))
        elif isinstance(data, JobSuspended | JobExited | JobMigrated):
            node = data.from_node if isinstance(data, JobMigrated) else data.node_id
            on[(data.user, data.job_id)].discard(node)
    return dict(most)


def story(events: list[DecodedEvent], job: Job) -> list[str]:
    """One job's events in stream order, one short line each: what a failed assertion shows."""
    lines = []
    for index, event in enumerate(events):
        data = event.data
        if isinstance(data, JobEvent) and (data.user, data.job_id) == job:
            where = getattr(data, "node_id", None) or getattr(data, "from_node", "")
            detail = ""
            if isinstance(data, JobResumed):
                detail = " in place" if data.in_place else f" from step {data.checkpoint_step}"
            elif isinstance(data, JobExited):
                detail = f" code {data.exit_code} signal {data.signal}: {data.stderr_tail[-300:]!r}"
            when = f"{event.envelope.time:%H:%M:%S.%f}"
            lines.append(f"{index} {when} {type(data).__name__} {where}{detail}")
    return lines


@dataclass(frozen=True, slots=True)
class Overlap:
    node_id: str
    gpu: int
    holder: str
    intruder: str
    sequence: int


def gpu_overlaps(events: list[DecodedEvent]) -> tuple[list[Overlap], int]:
    """Replays who held each (node, GPU): (overlaps found, GPU intervals seen).

    A job holds the GPUs of a `started` or `resumed` on that node until its `suspended` or
    `exited` there, or its `migrated` away from there, or its end for good (a cancel's kill reports
    nothing), or until it starts on another node: it
    only does once its old node let go or was declared failed, and a copy the failed node still
    runs is then either killed by a fence (a kill reports nothing) or, if another job's start
    comes first, suspended by the executor (reported). Each node's executor reports its own
    GPUs in order, so the stream order is the order on every GPU.

    A start reported after its job's end for good was already on its way when the end was
    read: the kill split-stride sent with the end runs after it on that node (a node runs a
    job's commands in order, and a later start on the same GPUs after the kill), so it holds
    nothing past its own report.
    """
    held: dict[tuple[str, int], str] = {}
    holding: dict[str, dict[str, tuple[int, ...]]] = {}  # job -> node -> its GPUs there
    size: dict[str, int] = {}
    over: set[str] = set()
    overlaps: list[Overlap] = []
    intervals = 0
    for index, event in enumerate(events):
        data = event.data
        if isinstance(data, JobSubmitted):
            size[f"{data.user}/{data.job_id}"] = data.gpus
        elif isinstance(data, JobStarted | JobResumed):
            job = f"{data.user}/{data.job_id}"
            if len(data.gpu_indices) == size.get(job):  # whole here, not a gang's part
                for node in list(holding.get(job, {})):
                    if node != data.node_id:
                        _release(held, holding, job, node)
            for gpu in data.gpu_indices:
                holder = held.get((data.node_id, gpu))
                if holder is not None and holder != job:
                    overlaps.append(Overlap(data.node_id, gpu, holder, job, index))
                if job not in over:
                    held[(data.node_id, gpu)] = job
            if job not in over:
                holding.setdefault(job, {})[data.node_id] = data.gpu_indices
            intervals += len(data.gpu_indices)
        elif isinstance(data, JobSuspended | JobExited | JobMigrated):
            job = f"{data.user}/{data.job_id}"
            node = data.from_node if isinstance(data, JobMigrated) else data.node_id
            _release(held, holding, job, node)
        elif isinstance(data, TERMINAL):
            # Over for good: split-stride sends its kills when it reads this, so a start it
            # sends later, to the same GPUs, comes after each kill on its node (a kill reports
            # nothing).
            job = f"{data.user}/{data.job_id}"
            over.add(job)
            for node in list(holding.get(job, {})):
                _release(held, holding, job, node)
    return overlaps, intervals


def _release(
    held: dict[tuple[str, int], str],
    holding: dict[str, dict[str, tuple[int, ...]]],
    job: str,
    node: str,
) -> None:
    nodes = holding.get(job, {})
    for gpu in nodes.pop(node, ()):
        if held.get((node, gpu)) == job:
            del held[(node, gpu)]
