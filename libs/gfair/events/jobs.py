"""Events of a job's life after submission, on `gfair.job.<user>.<job_id>.<event>`.

The `<event>` token is the verb of the event type (`gfair.job.started.v1` -> `started`).
Who publishes what:

- placement: held, accepted (at once, or when a held job's dependencies completed), rejected,
  placed
- node executor: started, progress, suspended, resumed, migrated, checkpointed, exited
- failure detector: completed, failed, retried (it classifies each `exited`, docs/design.md §2.6)
- placement, on a cancel request or a failed dependency: cancelled
"""

from __future__ import annotations

from typing import ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gfair.events.envelope import EventData
from gfair.events.fields import (
    AbsolutePath,
    Argv,
    Attempt,
    Bytes,
    Environment,
    ExitStatus,
    Generation,
    GpuCount,
    GpuIndices,
    ImageRef,
    JobId,
    JobRef,
    Mount,
    Name,
    NodeId,
    NodeIds,
    PositiveSeconds,
    Rate,
    Reason,
    Seconds,
    SignalNumber,
    StderrTail,
    Step,
    Tickets,
    TimeLimit,
    UserName,
    XidCode,
)
from gfair.events.job_array import ArrayMembership
from gfair.events.reasons import FailureClass, MigrationReason, RejectionCode, SuspendReason
from gfair.events.registry import register
from gfair.events.states import JobState
from gfair.events.subjects import PREFIX, job_subject, run_report_subject, validate_token


class JobEvent(EventData):
    """Base of every event about one job; `user` and `job_id` place it in the subject."""

    # The state the job is in after this event; None when the event does not move it.
    JOB_STATE: ClassVar[JobState | None] = None

    user: UserName
    job_id: JobId

    @property
    def job(self) -> JobRef:
        return JobRef(user=self.user, job_id=self.job_id)

    @classmethod
    def event_name(cls) -> str:
        return cls.EVENT_TYPE.split(".")[2]

    def subject(self) -> str:
        return job_subject(self.user, self.job_id, self.event_name())

    @classmethod
    def subject_pattern(cls) -> str:
        return f"{PREFIX}.job.*.*.{cls.event_name()}"


class RunReport(JobEvent):
    """What a node executor says of a job it runs. Its subject ends with the reporting node
    (`reporter`): NATS lets each executor publish only its own, and a payload naming another
    node than its subject is refused on arrival, so no node can speak for another."""

    @property
    def reporter(self) -> str:
        raise NotImplementedError

    def subject(self) -> str:
        return run_report_subject(self.user, self.job_id, self.event_name(), self.reporter)

    @classmethod
    def subject_pattern(cls) -> str:
        return f"{super().subject_pattern()}.*"

    @classmethod
    def reported_by(cls, node_id: str) -> str:
        """The subjects node `node_id` publishes these reports on (its permission)."""
        return f"{super().subject_pattern()}.{validate_token(node_id, what='node id')}"


class NodeReport(RunReport):
    """A run report about the job on `node_id`, which is the node that reports it."""

    node_id: NodeId

    @property
    def reporter(self) -> str:
        return self.node_id


def _not_success(failure_class: FailureClass) -> FailureClass:
    if failure_class is FailureClass.SUCCESS:
        raise ValueError("a failure cannot have failure class success")
    return failure_class


class JobLaunch(BaseModel):
    """How its user asked the job to run: its process (or container), and its limits. The one
    model of it: the submission, placement's record, the admission, the start and prepare
    commands and split-stride's record carry these fields, in this shape, so a per-job input
    declared here reaches the scheduler's core (`gfair.core.scheduler.Launch`) without another
    copy."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    command: Argv
    env: Environment = Field(default_factory=dict)
    working_dir: AbsolutePath | None = Field(
        default=None, description="Working directory on the node"
    )
    image: ImageRef | None = Field(
        default=None, description="Run in this container image; none: a process on the node"
    )
    mounts: tuple[Mount, ...] = Field(
        default=(), max_length=16, description="Host paths mounted into its container"
    )
    time_limit: TimeLimit | None = None

    @model_validator(mode="after")
    def _mounts_need_an_image(self) -> Self:
        if self.mounts and self.image is None:
            raise ValueError("mounts are for a job in a container image (give its image)")
        return self

    @classmethod
    def from_fields(cls, carrier: object) -> JobLaunch:
        """The launch fields of `carrier` (a submission, a record, a core `Launch`): only
        those, where pydantic's `model_validate` would hand back a subclass's instance whole."""
        return JobLaunch(**{name: getattr(carrier, name) for name in JobLaunch.model_fields})


@register
class JobAccepted(JobEvent):
    """Admission passed: the job waits for GPUs. It carries what scheduling and starting the
    job need (`launch`, `tickets`, `prepare`, `attempt`), so split-stride reads nothing of
    placement's; the envelope's correlation id is the job's (its submission's event id)."""

    EVENT_TYPE = "gfair.job.accepted.v1"
    JOB_STATE = JobState.QUEUED

    gpus: GpuCount
    job_type: Name | None = None
    array: ArrayMembership | None = Field(
        default=None, description="The job array it belongs to, whose limit caps its demand"
    )
    launch: JobLaunch = Field(
        description="Its command line, environment and working directory as submitted"
    )
    tickets: Tickets | None = Field(
        default=None, description="Weight among the user's own jobs; default equal"
    )
    prepare: bool = Field(default=False, description="It opted in to prepared starts")
    attempt: Attempt = 1

    @property
    def weight(self) -> float:
        """Weight among the user's jobs: equal unless the user says (docs/design.md §1.1)."""
        return self.tickets if self.tickets is not None else 1.0


@register
class JobHeld(JobEvent):
    """Admission passed, but the job waits for jobs it depends on (`after_ok`) to complete.

    It is not runnable and counts toward no demand until placement releases it with
    `JobAccepted`, or cancels it (`JobCancelled`) when one of them fails or is cancelled.
    """

    EVENT_TYPE = "gfair.job.held.v1"
    JOB_STATE = JobState.HELD

    gpus: GpuCount
    waiting_on: tuple[JobId, ...] = Field(
        min_length=1, description="The jobs (of the same user) it still waits for"
    )


@register
class JobRejected(JobEvent):
    """Admission failed; the job will never run. `code` says which check, `reason` why."""

    EVENT_TYPE = "gfair.job.rejected.v1"
    JOB_STATE = JobState.REJECTED

    code: RejectionCode
    reason: Reason


@register
class JobPlaced(JobEvent):
    """The job got a pool and servers; it runs there when its quanta come."""

    EVENT_TYPE = "gfair.job.placed.v1"
    JOB_STATE = JobState.PLACED

    servers: NodeIds = Field(description="Servers the gang runs on, each once")
    generation: Generation
    chosen_by: str | None = Field(
        default=None,
        description="Which pass of the scheduler's kernel placed it there (stride, surplus, "
        "fast-first, fastest-to-fastest, backfill)",
    )


@register
class JobStarted(NodeReport):
    """A node executor started the job's process on its GPUs (fresh or from a checkpoint)."""

    EVENT_TYPE = "gfair.job.started.v1"
    JOB_STATE = JobState.RUNNING

    gpu_indices: GpuIndices
    attempt: Attempt


@register
class JobProgress(NodeReport):
    """Mini-batch rate measured on one GPU generation: the profiler's raw observation."""

    EVENT_TYPE = "gfair.job.progress.v1"

    generation: Generation
    attempt: Attempt
    minibatches_per_s: Rate
    iterations: Step = Field(description="Mini-batches done so far, over all attempts")
    checkpoint_step: Step | None = Field(default=None, description="Step of the last checkpoint")
    window_s: PositiveSeconds | None = Field(default=None, description="Measured over this long")
    first_step_s: Seconds | None = Field(
        default=None,
        description="On a run's first report only: from the command that started it to its "
        "first mini-batch (a cold start or resume from a checkpoint: process, imports, loading)",
    )


@register
class JobSuspended(NodeReport):
    """Checkpointed and off its GPUs until a later quantum."""

    EVENT_TYPE = "gfair.job.suspended.v1"
    JOB_STATE = JobState.SUSPENDED

    attempt: Attempt
    reason: SuspendReason
    checkpoint_step: Step | None = None
    duration_s: Seconds | None = Field(default=None, description="Time the suspend took")
    forced: bool = Field(
        default=False,
        description="The job did not yield within its grace and was killed: what it did since "
        "`checkpoint_step` is lost",
    )
    overrun_s: Seconds | None = Field(
        default=None, description="How long past its grace it held its GPUs (forced yields)"
    )
    in_place: bool = Field(
        default=False,
        description="Parked in place (or, still coming up, frozen there): its process waits in "
        "the node's host memory, holding no GPU, and resumes there on the same GPUs without a "
        "checkpoint (`duration_s`: from the command to its GPUs being free)",
    )
    checkpoint_bytes: Bytes | None = Field(
        default=None, description="Size of the checkpoint this suspend wrote"
    )
    starting: bool = Field(
        default=False,
        description="Forced off before its first mini-batch: its process was still coming up "
        "(imports, loading its checkpoint) when its slice ended. Its next start may come up "
        "without GPUs first (a prepared start), so a start-up longer than a slice does not "
        "begin anew at every slice",
    )


@register
class JobResumed(NodeReport):
    """Back on GPUs from its checkpoint."""

    EVENT_TYPE = "gfair.job.resumed.v1"
    JOB_STATE = JobState.RUNNING

    gpu_indices: GpuIndices
    attempt: Attempt
    checkpoint_step: Step | None = None
    duration_s: Seconds | None = Field(default=None, description="Time the resume took")
    in_place: bool = Field(
        default=False,
        description="Continued in the process parked in place on this node (`duration_s`: "
        "from the command to its first mini-batch after it)",
    )


@register
class JobMigrated(RunReport):
    """Checkpointed and released on `from_node`; it next starts on `to_node`."""

    EVENT_TYPE = "gfair.job.migrated.v1"
    JOB_STATE = JobState.PLACED

    from_node: NodeId
    to_node: NodeId
    reason: MigrationReason
    attempt: Attempt
    checkpoint_step: Step | None = None

    @property
    def reporter(self) -> str:
        return self.from_node  # the node it leaves announces the move

    @model_validator(mode="after")
    def _moves(self) -> Self:
        if self.from_node == self.to_node:
            raise ValueError("from_node and to_node must differ")
        return self


@register
class JobCheckpointed(NodeReport):
    """A checkpoint was written: on failure the job resumes from here, not from scratch."""

    EVENT_TYPE = "gfair.job.checkpointed.v1"

    attempt: Attempt
    step: Step
    path: AbsolutePath
    size_bytes: Bytes | None = None
    duration_s: Seconds | None = None


@register
class JobExited(NodeReport):
    """The job's process ended without being asked to; the failure detector classifies it.

    Exactly one of `exit_code` (it exited) and `signal` (a signal killed it) is set.
    """

    EVENT_TYPE = "gfair.job.exited.v1"

    attempt: Attempt
    exit_code: ExitStatus | None = None
    signal: SignalNumber | None = None
    runtime_s: Seconds = Field(description="Wall time of this attempt")
    stderr_tail: StderrTail = ""
    xid_errors: tuple[XidCode, ...] = Field(
        default=(), description="NVML XID codes seen on the job's GPUs while it ran"
    )

    @model_validator(mode="after")
    def _one_cause(self) -> Self:
        if (self.exit_code is None) == (self.signal is None):
            raise ValueError("exactly one of exit_code and signal must be set")
        return self


@register
class JobCompleted(JobEvent):
    """Finished successfully."""

    EVENT_TYPE = "gfair.job.completed.v1"
    JOB_STATE = JobState.COMPLETED

    attempt: Attempt
    runtime_s: Seconds | None = Field(default=None, description="Wall time over all attempts")
    iterations: Step | None = None


@register
class JobFailed(JobEvent):
    """Failed for good: its class is not retried, or its retry budget is spent."""

    EVENT_TYPE = "gfair.job.failed.v1"
    JOB_STATE = JobState.FAILED

    failure_class: FailureClass
    reason: Reason
    attempt: Attempt
    node_id: NodeId | None = None
    exit_code: ExitStatus | None = None
    signal: SignalNumber | None = None
    stderr_tail: StderrTail = ""

    @model_validator(mode="after")
    def _is_failure(self) -> Self:
        _not_success(self.failure_class)
        return self


@register
class JobRetried(JobEvent):
    """A retryable failure: the job queues again for attempt `attempt` after `delay_s`."""

    EVENT_TYPE = "gfair.job.retried.v1"
    JOB_STATE = JobState.QUEUED

    attempt: Attempt = Field(description="The attempt about to be made (2 for the first retry)")
    delay_s: Seconds
    failure_class: FailureClass
    reason: Reason
    resume_from_step: Step | None = Field(default=None, description="None: from scratch")

    @model_validator(mode="after")
    def _is_retry(self) -> Self:
        _not_success(self.failure_class)
        if self.attempt < 2:
            raise ValueError("a retry is attempt 2 or later")
        return self


@register
class JobCancelled(JobEvent):
    """Cancelled on request; its processes are killed and its GPUs freed."""

    EVENT_TYPE = "gfair.job.cancelled.v1"
    JOB_STATE = JobState.CANCELLED

    previous_state: JobState
    reason: Reason | None = None

    @model_validator(mode="after")
    def _was_live(self) -> Self:
        if self.previous_state.terminal:
            raise ValueError(f"a {self.previous_state} job cannot be cancelled")
        return self
