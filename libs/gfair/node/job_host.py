"""Where a node's jobs run: the seam between the node executor and the things that run jobs.

The executor asks one `JobRunner` (`job_runner`) per tenant to start, suspend, resume in place
and kill runs, and reads what the runs report from its `events`; it asks the `JobHost` for the
runners and for the newest checkpoint of a job it is about to start. `ProcessHost` runs every
job as an OS process (`JobSupervisor`, checkpoints on the shared checkpoint root);
`gfair.node.virtual_jobs` runs them as virtual jobs in the executor's own process, for scale
tests. Where the operator allows images, `ProcessHost` runs a job that names one in a container
of it (`gfair.node.container_jobs`). Everything above this seam (which command means what,
what is reported when) is the same code for all.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gfair.node.job_runner import JobRunner, SupervisorConfig
from gfair.node.launch import CheckpointRef
from gfair.node.supervisor import JobSupervisor
from gfair.node.tenant_paths import exists_in
from gfair.sdk.checkpoint import CheckpointStore
from gfair.sdk.environment import PARKED_MARKER

if TYPE_CHECKING:
    from gfair.node.container_jobs import ContainerOptions


class JobHost(Protocol):
    def runner(self, config: SupervisorConfig) -> JobRunner[Any]:
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
    """Jobs as OS processes, their checkpoints in their directories on the checkpoint root;
    with `containers`, a job that names an image runs in it (`container_jobs`)."""

    def __init__(self, containers: ContainerOptions | None = None) -> None:
        self.containers = containers

    def runner(self, config: SupervisorConfig) -> JobRunner[Any]:
        if self.containers is None:
            return JobSupervisor(config)
        # Imported only here: the engine's client is an extra (`gfair[containers]`).
        from gfair.node.container_jobs import ContainerSupervisor

        return ContainerSupervisor(config, self.containers)

    def latest_checkpoint(self, checkpoint_dir: Path) -> CheckpointRef | None:
        latest = CheckpointStore(checkpoint_dir).latest()
        return CheckpointRef.of(latest) if latest is not None else None

    def parked_elsewhere(self, checkpoint_dir: Path) -> bool:
        # The marker is written by the parked job's SDK, possibly on another server sharing
        # the checkpoint root.
        return exists_in(checkpoint_dir, PARKED_MARKER)
