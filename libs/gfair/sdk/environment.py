"""The contract between the node supervisor and a job process: environment variables and files.

The supervisor writes these variables when it starts a job; the SDK reads them. Both sides import
this module, so a name cannot drift. Outside gfair none of them is set and the SDK falls back to
local defaults, so the same training script runs on a laptop.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_JOB_ID = "GFAIR_JOB_ID"
ENV_ATTEMPT = "GFAIR_ATTEMPT"
ENV_CHECKPOINT_DIR = "GFAIR_CHECKPOINT_DIR"
ENV_CONTROL_DIR = "GFAIR_CONTROL_DIR"
ENV_GPU_GENERATION = "GFAIR_GPU_GENERATION"
ENV_RESUME_CHECKPOINT = "GFAIR_RESUME_CHECKPOINT"
# Set to "1" for a prepared start: the process runs before it is given GPUs (none is visible)
# and `Job.from_env()` waits, parked, until the executor gives it some (or tells it to exit).
ENV_PREPARED = "GFAIR_PREPARED"

# Files inside the control directory.
PROGRESS_FILE = "progress.jsonl"
YIELD_FILE = "yield"
# The executor's answer to a job parked in place: resume here, or checkpoint and exit.
PARK_FILE = "park"

# In the job's checkpoint directory while a process of it is parked in place with state newer
# than its checkpoints: a node starting the job elsewhere waits for it to go (the parked
# process checkpoints, then removes it), so the move takes the newest state along.
PARKED_MARKER = ".gfair-parked"

# EX_TEMPFAIL from sysexits.h: "try again later", which is what a yielding job means.
YIELD_EXIT_CODE = 75

LOCAL_JOB_ID = "local"


@dataclass(frozen=True, slots=True)
class JobEnvironment:
    """Where a job's things are, as the supervisor told it (or local defaults)."""

    job_id: str
    attempt: int
    checkpoint_dir: Path
    # None outside gfair: progress is then kept in memory only.
    control_dir: Path | None
    gpu_generation: str | None
    # A specific committed checkpoint to resume from; None means "the newest valid one, if any".
    resume_checkpoint: Path | None
    managed: bool
    # Started prepared (`ENV_PREPARED`): no GPU until `Job.from_env()` has waited for them.
    prepared: bool = False

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str] | None = None, *, local_root: Path | None = None
    ) -> JobEnvironment:
        """Read the variables; without GFAIR_JOB_ID, use `<local_root>/checkpoints` locally.

        `local_root` defaults to `./.gfair` in the current directory.
        """
        env = os.environ if environ is None else environ
        job_id = env.get(ENV_JOB_ID)
        if not job_id:
            root = local_root if local_root is not None else Path.cwd() / ".gfair"
            return cls(
                job_id=LOCAL_JOB_ID,
                attempt=0,
                checkpoint_dir=Path(env.get(ENV_CHECKPOINT_DIR) or root / "checkpoints"),
                control_dir=None,
                gpu_generation=env.get(ENV_GPU_GENERATION) or None,
                resume_checkpoint=None,
                managed=False,
            )
        missing = [name for name in (ENV_CHECKPOINT_DIR, ENV_CONTROL_DIR) if not env.get(name)]
        if missing:
            raise ValueError(f"{ENV_JOB_ID} is set but {', '.join(missing)} is not")
        attempt_text = env.get(ENV_ATTEMPT, "0")
        try:
            attempt = int(attempt_text)
        except ValueError:
            raise ValueError(f"{ENV_ATTEMPT} must be an integer, got {attempt_text!r}") from None
        resume = env.get(ENV_RESUME_CHECKPOINT)
        return cls(
            job_id=job_id,
            attempt=attempt,
            checkpoint_dir=Path(env[ENV_CHECKPOINT_DIR]),
            control_dir=Path(env[ENV_CONTROL_DIR]),
            gpu_generation=env.get(ENV_GPU_GENERATION) or None,
            resume_checkpoint=Path(resume) if resume else None,
            managed=True,
            prepared=env.get(ENV_PREPARED) == "1",
        )

    def to_environ(self) -> dict[str, str]:
        """The variables that make `from_environ` return this environment."""
        env = {
            ENV_JOB_ID: self.job_id,
            ENV_ATTEMPT: str(self.attempt),
            ENV_CHECKPOINT_DIR: str(self.checkpoint_dir),
        }
        if self.control_dir is not None:
            env[ENV_CONTROL_DIR] = str(self.control_dir)
        if self.gpu_generation is not None:
            env[ENV_GPU_GENERATION] = self.gpu_generation
        if self.resume_checkpoint is not None:
            env[ENV_RESUME_CHECKPOINT] = str(self.resume_checkpoint)
        if self.prepared:
            env[ENV_PREPARED] = "1"
        return env
