"""What the node executor asks the supervisor to run, and the handle it gets back."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gfair.sdk.checkpoint import Checkpoint

# Job ids are subject tokens and directory names: nothing else may reach the filesystem.
_JOB_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def check_job_id(job_id: str) -> str:
    if not _JOB_ID.match(job_id):
        raise ValueError(f"job id {job_id!r} must match [A-Za-z0-9_-]{{1,64}}")
    return job_id


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    """A committed checkpoint as the scheduler records it: enough to resume from it anywhere."""

    seq: int
    step: int
    path: Path
    created_at: float

    @classmethod
    def of(cls, checkpoint: Checkpoint) -> CheckpointRef:
        return cls(checkpoint.seq, checkpoint.step, checkpoint.path, checkpoint.created_at)


@dataclass(frozen=True, slots=True)
class RunSpec:
    """Start `argv` for `job_id` on `gpu_indices` (all of one `generation`): a start or prepare
    command's launch (`gfair.events.jobs.JobLaunch`, which this package may not import), with
    what this node adds to run it.

    `attempt` counts retries after failures (the SDK exposes it). `resume_from` pins the
    checkpoint to resume from; None resumes from the newest valid checkpoint in the job's
    checkpoint directory, if there is one. `env` is added to the executor's environment.
    `gpu_uuids`, when given, must list the UUIDs of `gpu_indices` in the same order; they are
    used for CUDA_VISIBLE_DEVICES when the supervisor is configured for UUIDs.

    `prepared_gpus` makes it a prepared start: the process runs with no GPU visible
    (`gpu_indices` empty) and parks in the SDK's `Job.from_env()` until `resume_in_place`
    gives it that many GPUs; its limits are sized for them.
    """

    job_id: str
    argv: tuple[str, ...]
    gpu_indices: tuple[int, ...]
    generation: str
    attempt: int = 0
    env: Mapping[str, str] = field(default_factory=dict)
    gpu_uuids: tuple[str, ...] = ()
    workdir: Path | None = None
    resume_from: CheckpointRef | None = None
    prepared_gpus: int | None = None
    # The container image it runs in (`container_jobs`); None: an OS process. `mounts` are
    # HOST:CONTAINER[:ro], allowed by the operator (`ContainerPolicy`).
    image: str | None = None
    mounts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_job_id(self.job_id)
        if self.prepared_gpus is not None and (self.gpu_indices or self.prepared_gpus < 1):
            raise ValueError(f"job {self.job_id}: a prepared start has no GPUs yet, later some")
        if not self.argv:
            raise ValueError(f"job {self.job_id}: argv is empty")
        if len(set(self.gpu_indices)) != len(self.gpu_indices):
            raise ValueError(f"job {self.job_id}: gpu_indices {self.gpu_indices} repeat a GPU")
        if any(i < 0 for i in self.gpu_indices):
            raise ValueError(f"job {self.job_id}: gpu_indices {self.gpu_indices} are negative")
        if self.gpu_uuids and len(self.gpu_uuids) != len(self.gpu_indices):
            raise ValueError(f"job {self.job_id}: gpu_uuids and gpu_indices differ in length")
        if self.attempt < 0:
            raise ValueError(f"job {self.job_id}: attempt must be >= 0")


@dataclass(frozen=True, slots=True)
class JobPaths:
    """Where one run of a job keeps its things."""

    run_dir: Path
    workdir: Path
    control_dir: Path
    stdout: Path
    stderr: Path
    checkpoint_dir: Path


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A started job: its process group is `pgid` (== `pid`, a session leader)."""

    job_id: str
    attempt: int
    pid: int
    pgid: int
    gpu_indices: tuple[int, ...]
    generation: str
    started_at: float
    paths: JobPaths
