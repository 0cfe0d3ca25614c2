"""One supervised run: what the supervisor knows about it, and how its records update that.

No process handling here: the supervisor feeds in progress records, the exit status and the
newest checkpoint on disk; this turns them into the job's state and its lifecycle events.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc

from gfair.node.job_cgroup import Freezer, JobCgroup
from gfair.node.job_files import own_checkpoint
from gfair.node.job_limits import JobLimitGroups
from gfair.node.job_runner import SupervisedRun
from gfair.node.launch import CheckpointRef, RunSpec
from gfair.node.lifecycle import (
    CheckpointReport,
    JobEvent,
    ProgressReport,
)
from gfair.node.progress import ProgressTail, RateWindow
from gfair.node.run_directory import RunDirectory
from gfair.sdk.checkpoint import Checkpoint, CheckpointError, CheckpointStore, read_checkpoint
from gfair.sdk.progress import ProgressRecord

_log = logging.getLogger("gfair.node")


@dataclass(eq=False)
class SupervisedJob(SupervisedRun):
    launch: RunSpec
    process: anyio.abc.Process
    run: RunDirectory
    store: CheckpointStore
    tail: ProgressTail
    rates: RateWindow
    # The process whose SDK handles SIGUSR1 (said so in its `ready` record).
    sdk_pid: int | None = None
    yield_reported: bool = False
    completed: bool = False
    last_progress_at: float = -math.inf
    # Progress is news only once this run reports a mini-batch of its own.
    progress_emitted_steps: int = 0
    # The job's own cgroup, where the node makes them (job_cgroup.py).
    cgroup: JobCgroup | None = None
    # What holds all of it in place (`JobSupervisor._freeze`, `_hold`): its cgroup, or its
    # container (`container_jobs`); None: it cannot be frozen.
    freezer: Freezer | None = None
    # Its memory and CPU limits, where the node sets them (job_limits.py).
    limits: JobLimitGroups | None = None
    # The uid the job's files must belong to (its account's); None: any (the executor's own).
    owner: int | None = None
    # Files the job pointed the executor at that were not its own (job_files.py), and why.
    refused: list[str] = field(default_factory=list)
    # Parked in place (the SDK's `suspend`): its park number, when it said so (its clock, wall
    # time) and since when (the supervisor's monotonic clock); None while it runs.
    parked: int | None = None
    parked_at: float | None = None
    parked_since: float | None = None
    # Its word that it parked is checked (`JobSupervisor._hold`): its cgroup frozen while it
    # waits for the node's answer (`held`), which it may act on once given (`answered`); what
    # showed the word false, if anything did (it is then killed, its yield forced).
    held: bool = False
    answered: bool = False
    broke_park: str | None = None
    park_lock: anyio.Lock = field(default_factory=anyio.Lock)
    # Frozen in place while it still came up (`JobSupervisor.suspend`): since when (monotonic
    # clock); None while it runs.
    frozen_since: float | None = None
    # After an in-place resume: when it said it resumed, and when its first step after that
    # ended (wall time, the job's clock); what the resume cost is measured by.
    resumed_at: float | None = None
    first_step_at: float | None = None
    # When the run's first mini-batch ended (wall time, the job's clock).
    run_first_step_at: float | None = None
    # Set, and replaced by a fresh one, whenever records arrived or the job exited.
    news: anyio.Event = field(default_factory=anyio.Event)
    # Someone waits for this job's records: read its progress file often.
    eager: bool = False

    @property
    def holds_gpus(self) -> bool:
        """Whether its processes hold its GPUs: not while parked or frozen in place."""
        return self.parked is None and self.frozen_since is None

    @property
    def frozen(self) -> bool:
        """Frozen while it came up, or held parked: SIGTERM would not reach it, SIGKILL does."""
        return self.frozen_since is not None or self.held

    @property
    def in_place_since(self) -> float | None:
        """Since when it waits in place (parked or frozen), holding host memory only."""
        return self.parked_since if self.frozen_since is None else self.frozen_since

    def absorb(self, records: list[ProgressRecord]) -> list[JobEvent]:
        """Update from the job's records; return the lifecycle events they imply."""
        events: list[JobEvent] = []
        for record in records:
            if self.parked is not None and not self.answered and self.broke_park is None:
                # The SDK writes nothing between its park and the node's answer.
                self.broke_park = f"wrote a {record.kind} record after it said it parked"
            if record.kind == "step" and record.step is not None:
                self.steps = record.step
                self.rates.add(record.time, record.step)
                if self.run_first_step_at is None:
                    self.run_first_step_at = record.time
                if self.resumed_at is not None and self.first_step_at is None:
                    self.first_step_at = record.time
            elif record.kind == "checkpoint":
                events.extend(self._note_checkpoint(record))
            elif record.kind == "ready":
                if record.handles_sigusr1 and record.pid is not None:
                    self.sdk_pid = record.pid
            elif record.kind == "yield":
                self.yield_reported = True
            elif record.kind == "parked":
                self.parked, self.parked_at = record.park, record.time
                self.parked_since = time.monotonic()
                self.answered = False
                self.rates = RateWindow(self.rates.window_s)  # a pause is not a slow step
            elif record.kind == "resumed":
                self.parked = self.parked_since = None
                self.resumed_at = record.time
            elif record.kind == "complete":
                self.completed = True
        return events

    def progress_due(self, interval_s: float) -> ProgressReport | None:
        """A progress report if the job advanced and the last report is `interval_s` old."""
        now = time.monotonic()
        if self.steps == self.progress_emitted_steps or now - self.last_progress_at < interval_s:
            return None
        rate = self.rates.rate()
        if rate is None:
            # One record makes no rate, and a report without one says nothing: wait for the
            # next record (the SDK writes one every 0.2 s) rather than an interval, or a short
            # slice would report no progress at all.
            return None
        self.last_progress_at = now
        self.progress_emitted_steps = self.steps
        return ProgressReport(
            job_id=self.handle.job_id,
            attempt=self.handle.attempt,
            time=time.time(),
            steps=self.steps,
            rate_per_s=rate,
            window_s=self.rates.window_s,
            checkpoint_step=self.checkpoint.step if self.checkpoint else None,
            first_step_at=self.run_first_step_at,
        )

    def finish(
        self, returncode: int, latest: Checkpoint | None, stderr_tail: str
    ) -> list[JobEvent]:
        """Settle the exit; return the events to deliver, the ExitReport last.

        `latest` is the newest valid checkpoint now: the job may have committed one and died
        before announcing it, and the checkpoint directory, not the announcements, is the truth.
        """
        try:
            events = self.absorb(self.tail.read())
        except Exception:
            # The exit is reported whatever the job's last records make fail.
            _log.exception("job %s: its last progress records were not read", self.handle.job_id)
            events = []
        self.tail.close()
        if self.tail.refused is not None:
            self.refuse(f"its progress file: {self.tail.refused}")
        if latest is None:
            self.checkpoint = None
        elif self.checkpoint is None or latest.seq > self.checkpoint.seq:
            self.checkpoint = CheckpointRef.of(latest)
            events.append(self._checkpointed())
        exit_code = returncode if returncode >= 0 else None
        signum = -returncode if returncode < 0 else None
        completed = self.completed and exit_code == 0
        exited = self.settle(
            exit_code, signum, stderr_tail, completed=completed, reported=self.yield_reported
        )
        self.run.write_exit(
            {
                "exit_code": exit_code,
                "signal": signum,
                "yielded": exited.yielded,
                "completed": completed,
                "terminated_by": self.terminated_by,
                "reason": self.reason,
                "steps": self.steps,
            }
        )
        events.append(exited)
        return events

    def _note_checkpoint(self, record: ProgressRecord) -> list[JobEvent]:
        if record.checkpoint_path is None:
            return []
        if not self.owns(Path(record.checkpoint_path)):
            return []
        try:
            checkpoint = read_checkpoint(Path(record.checkpoint_path))
        except CheckpointError:
            return []  # already pruned, or not what the job claims: the exit scan settles it
        if self.checkpoint is not None and checkpoint.seq <= self.checkpoint.seq:
            return []
        self.checkpoint = CheckpointRef.of(checkpoint)
        return [self._checkpointed()]

    def own_latest(self) -> Checkpoint | None:
        """The newest valid checkpoint in the job's directory that is its own (`latest` for
        `finish`): a link the job put there to another job's checkpoint is passed over."""
        for checkpoint in self.store.checkpoints():
            if self.owns(checkpoint.path):
                return checkpoint
        return None

    def owns(self, checkpoint: Path) -> bool:
        """Whether `checkpoint` is one of this job's own; if not, the refusal is noted."""
        why = own_checkpoint(checkpoint, self.store.root, self.owner)
        if why is not None:
            self.refuse(f"checkpoint {checkpoint}: {why}")
        return why is None

    def refuse(self, why: str) -> None:
        if why in self.refused:
            return
        self.refused.append(why)
        _log.warning(
            "ignored a file a job named that is not its own: job %s: %s", self.handle.job_id, why
        )

    def _checkpointed(self) -> CheckpointReport:
        assert self.checkpoint is not None
        return CheckpointReport(
            self.handle.job_id, self.handle.attempt, time.time(), self.checkpoint
        )
