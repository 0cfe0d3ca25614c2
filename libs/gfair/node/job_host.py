"""Where a node's jobs run: the seam between the node executor and the things that run jobs.

The executor asks one `JobRunner` per tenant to start, suspend, resume in place and kill runs,
and reads what the runs report from its `events`; it asks the `JobHost` for the runners and
for the newest checkpoint of a job it is about to start. `ProcessHost` runs every job as an OS
process (`JobSupervisor`, checkpoints on the shared checkpoint root); `gfair.node.virtual_jobs`
runs them as virtual jobs in the executor's own process, for scale tests. Everything above
this seam (which command means what, what is reported when) is the same code for both.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Literal, Protocol

from anyio.streams.memory import MemoryObjectReceiveStream

from gfair.node.launch import CheckpointRef, RunningJob, RunSpec
from gfair.node.lifecycle import JobEvent, JobExited, ParkedJob, SuspendResult
from gfair.node.orphans import ReapedRun
from gfair.node.supervisor import JobSupervisor, SupervisorConfig
from gfair.node.tenant_paths import exists_in
from gfair.sdk.checkpoint import CheckpointStore
from gfair.sdk.environment import PARKED_MARKER


class JobRunner(Protocol):
    """One tenant's jobs on one node (`JobSupervisor` is the reference: its docs are these)."""

    events: MemoryObjectReceiveStream[JobEvent]
    # Runs an earlier executor of this node left behind, stopped when the runner started.
    reaped: list[ReapedRun]

    async def __aenter__(self) -> JobRunner: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None: ...

    def running(self) -> list[RunningJob]: ...

    def parked(self) -> list[ParkedJob]: ...

    async def start(self, launch: RunSpec) -> RunningJob: ...

    async def suspend(
        self, job_id: str, timeout_s: float, *, enforce: bool = False, park: bool = False
    ) -> SuspendResult: ...

    async def resume_in_place(
        self,
        job_id: str,
        timeout_s: float,
        gpu_indices: tuple[int, ...] | None = None,
        gpu_uuids: tuple[str, ...] = (),
    ) -> float | None: ...

    def coming_up(self, job_id: str) -> bool: ...

    async def until_parked(
        self, job_id: str, timeout_s: float
    ) -> Literal["parked", "exited", "timeout"]: ...

    async def kill(self, job_id: str, reason: str) -> JobExited: ...

    def told(self, job: RunningJob) -> None:
        """The scheduler was told how `job`'s run ended (or needs no telling): a restart after
        this finds nothing of it to report."""
        ...


class JobHost(Protocol):
    def runner(self, config: SupervisorConfig) -> JobRunner:
        """A runner for the tenant `config` describes (entered by the caller)."""
        ...

    def latest_checkpoint(self, checkpoint_dir: Path) -> CheckpointRef | None:
        """The newest committed checkpoint of the job whose directory this is."""
        ...

    def parked_elsewhere(self, checkpoint_dir: Path) -> bool:
        """Whether a run of the job is parked in place somewhere, holding newer state than its
        checkpoints until it has checkpointed."""
        ...


class ProcessHost:
    """Jobs as OS processes, their checkpoints in their directories on the checkpoint root."""

    def runner(self, config: SupervisorConfig) -> JobRunner:
        return JobSupervisor(config)

    def latest_checkpoint(self, checkpoint_dir: Path) -> CheckpointRef | None:
        latest = CheckpointStore(checkpoint_dir).latest()
        return CheckpointRef.of(latest) if latest is not None else None

    def parked_elsewhere(self, checkpoint_dir: Path) -> bool:
        # The marker is written by the parked job's SDK, possibly on another server sharing
        # the checkpoint root.
        return exists_in(checkpoint_dir, PARKED_MARKER)
