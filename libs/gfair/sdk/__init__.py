"""The job SDK: what a training script calls to run well under gfair (stdlib only).

A training loop::

    from gfair.sdk import Job

    job = Job.from_env()
    state = job.load_checkpoint()
    for step in range(state["step"] if state else 0, total):
        train_one_minibatch()
        job.report(step)
        if job.should_yield():
            job.save_checkpoint({"step": step + 1})
            job.exit_for_yield()
    job.complete()

In a multi-process job (one process per GPU), let one process (rank 0) report and checkpoint;
every process may call `should_yield()` (the yield file reaches them all) and must then stop.
"""

from gfair.sdk.checkpoint import Checkpoint, CheckpointError, CheckpointStore, read_checkpoint
from gfair.sdk.environment import YIELD_EXIT_CODE, JobEnvironment
from gfair.sdk.job import Job

__all__ = [
    "YIELD_EXIT_CODE",
    "Checkpoint",
    "CheckpointError",
    "CheckpointStore",
    "Job",
    "JobEnvironment",
    "read_checkpoint",
]
