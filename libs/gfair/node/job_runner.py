"""What every kind of job runner shares: one tenant's runs on one node, their lifecycle and
what is reported of it.

A `JobRunner` starts runs, asks them to yield (checkpoint and exit), forces them off their GPUs
when they do not (SIGTERM, then SIGKILL), kills them, and reports their progress, checkpoints
and one exit each on `events`; leaving its `async with` block suspends every run, then kills
what is left. A kind of job (`JobSupervisor`: OS processes; `VirtualSupervisor`: synthetic jobs
without processes) says only how a run is started (`_launch`), watched until it exits
(`_watch`), asked to yield (`_suspend`) and signalled (`_signal`). A kind that can hold a run in
place (parked, frozen) overrides `parked`, `resume_in_place`, `coming_up` and `until_parked`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Generic, Literal, Self, TypeVar

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from gfair.node.job_account import JobAccount
from gfair.node.job_cgroup import CgroupTree
from gfair.node.job_limits import LimitTree
from gfair.node.launch import CheckpointRef, RunningJob, RunSpec, check_job_id
from gfair.node.lifecycle import (
    Escalation,
    ExitReport,
    JobEvent,
    ParkedJob,
    ProgressReport,
    SuspendResult,
    exit_was_yield,
)
from gfair.node.orphans import ReapedRun
from gfair.node.progress import ProgressLimits

# Finished runs remembered for `wait`/`suspend`/`kill` after the fact.
_FINISHED_KEPT = 1024


class SupervisorError(Exception):
    """A request the supervisor refuses; the message says why."""


class JobNotSupervised(SupervisorError, KeyError):
    pass


class JobStartError(SupervisorError):
    pass


@dataclass(frozen=True, slots=True)
class SupervisorConfig:
    """`run_root` is this executor's (logs, control files); `checkpoint_root` is shared by every
    executor that may resume a job (same machine or a shared filesystem)."""

    node_id: str
    run_root: Path
    checkpoint_root: Path
    # GPU indices this node has; None skips the check (the caller validated).
    gpu_indices: frozenset[int] | None = None
    term_grace_s: float = 5.0
    shutdown_timeout_s: float = 30.0
    poll_interval_s: float = 0.1
    progress_interval_s: float = 1.0
    rate_window_s: float = 10.0
    # What reading a job's progress may cost, whatever the job writes there.
    progress_limits: ProgressLimits = dataclasses.field(default_factory=ProgressLimits)
    stderr_tail_bytes: int = 4096
    # "index" pairs with CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA numbers GPUs as NVML does.
    visible_devices: Literal["index", "uuid"] = "index"
    # Host variables a job's process gets (what a program needs to run: where things are, the
    # locale, the interpreter's and CUDA's paths). Nothing else of the executor's environment
    # reaches a job: never its NATS URL or credentials, nor any service setting.
    inherit_env: bool = True
    event_buffer: int = 10_000
    # Become a child subreaper (Linux) so stragglers a job leaves behind can be reaped.
    reap_descendants: bool = True
    # The OS account the jobs run as (the executor must be root); None: the executor's own,
    # which must not be root (jobs never run as root: the supervisor refuses to start).
    account: JobAccount | None = None
    # Where each job gets a cgroup of its own (job_cgroup.py); None: the host gives none.
    cgroups: CgroupTree | None = None
    # Memory and CPU limits per job (job_limits.py); None: none asked for.
    limits: LimitTree | None = None
    # GPU index -> its device node, the one a job may open where its limits hold devices.
    gpu_devices: Mapping[int, Path] | None = None
    # One GPU's share of the node's CPUs: a job's math libraries start that many threads per
    # GPU it holds (job_threads.py), unless it says otherwise; None: the libraries' defaults.
    threads_per_gpu: float | None = None
    # How many processes hold GPU memory on these of the node's GPUs (`GpuBackend.
    # compute_processes`; None from it: cannot tell). Without it (None), a job still coming up
    # when its slice ends is never frozen in place (`suspend`).
    gpu_processes: Callable[[Sequence[int]], int | None] | None = None
    # What one job may keep under its run directory, and in each of its output files
    # (`job_disk`); None: no cap.
    disk_max_bytes: int | None = None
    output_max_bytes: int | None = None
    # The node's shared temporary directories, cleared of what an account left once none of
    # its jobs runs here (only for an account of its own: never the executor's).
    shared_tmp: tuple[Path, ...] = (Path("/tmp"), Path("/var/tmp"))
    disk_check_s: float = 30.0


@dataclass(eq=False, kw_only=True)
class SupervisedRun:
    """What a runner knows of one run of a job, whatever runs it, and how its exit is settled."""

    handle: RunningJob
    started_monotonic: float
    # Set once its exit is settled and its events are in the stream.
    exited: anyio.Event = field(default_factory=anyio.Event)
    exit: ExitReport | None = None
    steps: int = 0
    checkpoint: CheckpointRef | None = None
    yield_requested: bool = False
    terminating: bool = False
    # Terminated because a suspend timed out: still a yield (the GPUs were asked back).
    forced_yield: bool = False
    terminated_by: Escalation | None = None
    reason: str | None = None

    @property
    def holds_gpus(self) -> bool:
        """Whether it holds its GPUs now (not while it waits in place)."""
        return True

    @property
    def frozen(self) -> bool:
        """Whether it is held where it cannot act on SIGTERM (only SIGKILL reaches it)."""
        return False

    def settle(
        self,
        exit_code: int | None,
        signum: int | None,
        stderr_tail: str,
        *,
        completed: bool,
        reported: bool = False,
    ) -> ExitReport:
        """Its exit, from how it ended and what it was asked (`reported`: it said it yielded)."""
        self.exit = ExitReport(
            job_id=self.handle.job_id,
            attempt=self.handle.attempt,
            time=time.time(),
            exit_code=exit_code,
            signal=signum,
            duration_s=time.monotonic() - self.started_monotonic,
            stderr_tail=stderr_tail,
            yielded=exit_was_yield(
                requested=self.yield_requested,
                completed=completed,
                exit_code=exit_code,
                forced=self.forced_yield,
                reported=reported,
            ),
            completed=completed,
            terminated_by=self.terminated_by,
            reason=self.reason,
            steps=self.steps,
            checkpoint=self.checkpoint,
        )
        return self.exit


R = TypeVar("R", bound=SupervisedRun)


class JobRunner(ABC, Generic[R]):
    """One tenant's jobs on one node: the lifecycle every kind of job shares."""

    def __init__(self, config: SupervisorConfig) -> None:
        self.config = config
        self._jobs: dict[str, R] = {}
        self._finished: OrderedDict[str, ExitReport] = OrderedDict()
        send, receive = anyio.create_memory_object_stream[JobEvent](config.event_buffer)
        self._send: MemoryObjectSendStream[JobEvent] = send
        self.events: MemoryObjectReceiveStream[JobEvent] = receive
        self.dropped_progress_events = 0
        # Runs an earlier executor of this node left behind, stopped when the runner started.
        self.reaped: list[ReapedRun] = []
        self._tasks: anyio.abc.TaskGroup | None = None
        self._open = False

    # ----- what differs by kind ----------------------------------------------------------------

    @abstractmethod
    async def _launch(self, launch: RunSpec) -> R:
        """Start the run (`start` checked the request); it is watched from now on (`_watch`)."""

    @abstractmethod
    async def _watch(self, run: R) -> None:
        """Follow the run until it exits: report its progress, settle its exit (`_exited`)."""

    @abstractmethod
    async def _suspend(
        self, run: R, timeout_s: float, *, enforce: bool, park: bool
    ) -> SuspendResult:
        """Ask the running `run` to yield and wait for it (`suspend`), forced by `_force_off`."""

    @abstractmethod
    def _signal(self, run: R, signum: signal.Signals) -> None:
        """Send `signum` to the run, all of it (`_terminate`)."""

    async def _closing(self) -> None:
        """What to release once every run stopped (`__aexit__`)."""

    # ----- the lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._tasks = anyio.create_task_group()
        await self._tasks.__aenter__()
        self._open = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        # Shielded: even when the executor is being cancelled, its jobs must not outlive it.
        with anyio.CancelScope(shield=True):
            await self.shutdown()
            await self._closing()
        assert self._tasks is not None
        self._tasks.cancel_scope.cancel()
        # The block's own exception is not the watchers' business: let it propagate as is,
        # rather than wrapped in an exception group.
        try:
            await self._tasks.__aexit__(None, None, None)
        finally:
            self._send.close()  # whatever a watcher raised, the reports' reader ends
        return None

    def running(self) -> list[RunningJob]:
        return [run.handle for run in self._jobs.values()]

    def busy_gpus(self) -> frozenset[int]:
        """GPUs held by runs; a run waiting in place holds none."""
        return frozenset(
            i for run in self._jobs.values() if run.holds_gpus for i in run.handle.gpu_indices
        )

    def parked(self) -> list[ParkedJob]:
        """Runs parked or frozen in place, longest first, with their host memory (RSS)."""
        return []

    async def start(self, launch: RunSpec) -> RunningJob:
        """Start a job (fresh, resumed or migrated here); returns once it runs."""
        if self._tasks is None or not self._open:
            raise SupervisorError("the supervisor is not running (use `async with`)")
        if launch.job_id in self._jobs:
            raise SupervisorError(f"job {launch.job_id} is already running on this node")
        known = self.config.gpu_indices
        unknown = set() if known is None else set(launch.gpu_indices) - known
        if unknown:
            raise SupervisorError(f"job {launch.job_id}: this node has no GPU {sorted(unknown)}")
        taken = self.busy_gpus() & set(launch.gpu_indices)
        # (A job parked in place must be told to leave first: `suspend`, then start.)
        if taken:
            raise SupervisorError(f"job {launch.job_id}: GPUs {sorted(taken)} are in use")
        run = await self._launch(launch)
        self._jobs[launch.job_id] = run
        self._finished.pop(launch.job_id, None)
        self._tasks.start_soon(self._watch, run, name=f"gfair-job-{launch.job_id}")
        return run.handle

    async def suspend(
        self, job_id: str, timeout_s: float, *, enforce: bool = False, park: bool = False
    ) -> SuspendResult:
        """Ask the job to checkpoint and exit; force it after `timeout_s`; say what survived.

        With `park` the job may instead yield in place where its kind can (`JobSupervisor`).
        Forcing is SIGTERM, then SIGKILL after the term grace: a job may still checkpoint on
        SIGTERM (a drain at shutdown). With `enforce` (a yield the scheduler is owed: another
        job waits for these GPUs) forcing is SIGKILL at once. It resumes from its last
        checkpoint."""
        run = self._jobs.get(job_id)
        if run is None:
            finished = self._finished_exit(job_id)
            return SuspendResult(job_id, finished.checkpoint, False, None, 0.0, finished)
        return await self._suspend(run, timeout_s, enforce=enforce, park=park)

    async def resume_in_place(
        self,
        job_id: str,
        timeout_s: float,
        gpu_indices: tuple[int, ...] | None = None,
        gpu_uuids: tuple[str, ...] = (),
    ) -> float | None:
        """Continue a job waiting in place; the seconds to its first mini-batch after, or None
        when it cannot (the caller then stops it and starts it anew from its checkpoint)."""
        return None

    def coming_up(self, job_id: str) -> bool:
        """Whether the job has neither ended a mini-batch nor parked yet (and could be frozen
        while it comes up)."""
        return False

    async def until_parked(
        self, job_id: str, timeout_s: float
    ) -> Literal["parked", "exited", "timeout"]:
        """Wait for a prepared start to park (or to end first)."""
        return "exited"

    def told(self, job: RunningJob) -> None:
        """The scheduler was told how `job`'s run ended (or needs no telling): a restart after
        this finds nothing of it to report."""

    async def kill(self, job_id: str, reason: str) -> ExitReport:
        """Stop the job now (SIGTERM, then SIGKILL after the grace period); no checkpoint."""
        run = self._jobs.get(job_id)
        if run is None:
            return self._finished_exit(job_id)
        await self._terminate(run, reason, forced_yield=False)
        assert run.exit is not None
        return run.exit

    async def wait(self, job_id: str) -> ExitReport:
        run = self._jobs.get(job_id)
        if run is None:
            return self._finished_exit(job_id)
        await run.exited.wait()
        assert run.exit is not None
        return run.exit

    async def shutdown(self, timeout_s: float | None = None) -> list[SuspendResult]:
        """Suspend every job concurrently (checkpoint, then force); refuse new starts."""
        self._open = False
        timeout = self.config.shutdown_timeout_s if timeout_s is None else timeout_s
        results: list[SuspendResult] = []

        async def suspend_one(job_id: str) -> None:
            results.append(await self.suspend(job_id, timeout))

        async with anyio.create_task_group() as group:
            for job_id in list(self._jobs):
                group.start_soon(suspend_one, job_id)
        return results

    # ----- for the kinds ------------------------------------------------------------------------

    async def _force_off(
        self,
        run: R,
        timeout_s: float,
        *,
        enforce: bool,
        before_seq: int | None,
        requested_at: float,
        escalation: Escalation | None = None,
    ) -> SuspendResult:
        """The end of a suspend whose run did not park: forced off its GPUs unless it exited
        since it was asked (at `requested_at`, monotonic, its newest checkpoint then
        `before_seq`)."""
        if not run.exited.is_set():
            escalation = await self._terminate(
                run,
                f"did not yield within {timeout_s:g}s",
                forced_yield=True,
                term_grace_s=0.0 if enforce else None,
            )
        assert run.exit is not None
        after = run.exit.checkpoint
        return SuspendResult(
            job_id=run.handle.job_id,
            checkpoint=after,
            fresh=after is not None and (before_seq is None or after.seq > before_seq),
            escalation=escalation,
            switch_s=time.monotonic() - requested_at,
            exited=run.exit,
        )

    async def _terminate(
        self, run: R, reason: str, *, forced_yield: bool, term_grace_s: float | None = None
    ) -> Escalation | None:
        """SIGTERM, then SIGKILL after the grace (at once for a frozen run); how it ended."""
        if run.exited.is_set():
            return None
        if run.terminating:
            await run.exited.wait()
            return run.terminated_by
        run.terminating = True
        run.forced_yield = forced_yield
        run.reason = reason
        grace = self.config.term_grace_s if term_grace_s is None else term_grace_s
        if grace > 0 and not run.frozen:
            run.terminated_by = "SIGTERM"
            self._signal(run, signal.SIGTERM)
            with anyio.move_on_after(grace):
                await run.exited.wait()
        if not run.exited.is_set():
            run.terminated_by = "SIGKILL"
            self._signal(run, signal.SIGKILL)
            await run.exited.wait()
        return run.terminated_by

    def _exited(self, run: R) -> None:
        """The run's exit is settled: its GPUs are free, its exit kept for later questions."""
        assert run.exit is not None
        self._jobs.pop(run.handle.job_id, None)
        self._finished[run.handle.job_id] = run.exit
        while len(self._finished) > _FINISHED_KEPT:
            self._finished.popitem(last=False)

    async def _deliver(self, event: JobEvent) -> None:
        # Nobody listening any more is fine: what a kind keeps of its runs remains.
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self._send.send(event)

    def _emit_progress(self, event: ProgressReport) -> None:
        try:
            self._send.send_nowait(event)
        except anyio.WouldBlock:
            # Progress is periodic and superseded by the next one; lifecycle events never drop.
            self.dropped_progress_events += 1
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    def _finished_exit(self, job_id: str) -> ExitReport:
        check_job_id(job_id)
        exited = self._finished.get(job_id)
        if exited is None:
            raise JobNotSupervised(job_id)
        return exited
