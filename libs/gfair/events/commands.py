"""Commands for one node executor, on `gfair.cmd.<node_id>.<command>`.

The `<command>` token is the verb of the event type (`gfair.cmd.start.v1` -> `start`). Every
command names the attempt it is about, so an executor ignores a command for an attempt it has
already moved past (commands are delivered at least once, and may arrive late).
"""

from __future__ import annotations

from typing import Self

from pydantic import AwareDatetime, Field, model_validator

from gfair.events.envelope import EventData
from gfair.events.fields import (
    AbsolutePath,
    Attempt,
    Generation,
    GpuCount,
    GpuIndices,
    JobId,
    JobRef,
    NodeId,
    PositiveSeconds,
    Reason,
    UserName,
)
from gfair.events.jobs import JobLaunch
from gfair.events.reasons import MigrationReason, SuspendReason
from gfair.events.registry import register
from gfair.events.subjects import PREFIX, command_subject


class NodeCommand(EventData):
    """Base of every command: which executor (`node_id`) does what to which job."""

    node_id: NodeId
    user: UserName
    job_id: JobId
    attempt: Attempt

    @property
    def job(self) -> JobRef:
        return JobRef(user=self.user, job_id=self.job_id)

    @classmethod
    def command_name(cls) -> str:
        return cls.EVENT_TYPE.split(".")[2]

    def subject(self) -> str:
        return command_subject(self.node_id, self.command_name())

    @classmethod
    def subject_pattern(cls) -> str:
        return f"{PREFIX}.cmd.*.{cls.command_name()}"


@register
class StartCommand(NodeCommand, JobLaunch):
    """Run the job on these GPUs; when `checkpoint_dir` holds a checkpoint it resumes from it."""

    EVENT_TYPE = "gfair.cmd.start.v1"

    gpu_indices: GpuIndices
    checkpoint_dir: AbsolutePath = Field(
        description="Where the job writes and finds its checkpoints"
    )
    valid_until: AwareDatetime | None = Field(
        default=None,
        description="Run it only until then: later the scheduler may have forgotten this start "
        "and run the job elsewhere, so the node refuses it (None, from schedulers before "
        "2026-12: only the node's command_max_age_s applies)",
    )


@register
class PrepareCommand(NodeCommand, JobLaunch):
    """Start the job's process without GPUs (none visible), prepared: it imports what it needs,
    then parks in `Job.from_env()` (reported as `JobSuspended` with `in_place`) until a start
    on this node gives it GPUs. Only for jobs submitted with `prepare`."""

    EVENT_TYPE = "gfair.cmd.prepare.v1"

    gpus: GpuCount = Field(description="GPUs its later start will give it (sizes its limits)")
    generation: Generation = Field(description="The generation of the GPUs it will be given")
    checkpoint_dir: AbsolutePath = Field(
        description="Where the job writes and finds its checkpoints"
    )


@register
class SuspendCommand(NodeCommand):
    """Checkpoint the job and free its GPUs."""

    EVENT_TYPE = "gfair.cmd.suspend.v1"

    reason: SuspendReason = SuspendReason.TIME_SLICE
    yield_grace_s: PositiveSeconds | None = Field(
        default=None,
        description="How long the job has to checkpoint and let its GPUs go; past it the node "
        "kills it (forced yield: it resumes from its last checkpoint). None: the node's own "
        "suspend timeout",
    )


@register
class ResumeCommand(NodeCommand):
    """Bring a job suspended on this node back from its checkpoint, on these GPUs."""

    EVENT_TYPE = "gfair.cmd.resume.v1"

    gpu_indices: GpuIndices


@register
class MigrateCommand(NodeCommand):
    """Checkpoint the job and release it here; it starts next on `to_node`."""

    EVENT_TYPE = "gfair.cmd.migrate.v1"

    to_node: NodeId
    reason: MigrationReason

    @model_validator(mode="after")
    def _moves(self) -> Self:
        if self.to_node == self.node_id:
            raise ValueError("to_node must differ from node_id")
        return self


@register
class KillCommand(NodeCommand):
    """Stop the job's process now, without a checkpoint."""

    EVENT_TYPE = "gfair.cmd.kill.v1"

    reason: Reason
    started_before: AwareDatetime | None = Field(
        default=None,
        description="Kill only a run that started before this time: a fence of a copy left "
        "behind says when the job started elsewhere, so it cannot kill a newer start its "
        "sender had not heard of yet",
    )
