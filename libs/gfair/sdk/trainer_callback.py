"""Hugging Face `Trainer` through gfair: progress, yield and checkpoints in the trainer's hooks.

    from gfair.sdk.trainer_callback import GfairTrainerCallback

    gfair = GfairTrainerCallback()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[gfair])
    trainer.train(resume_from_checkpoint=gfair.resume_path())
    gfair.finish()      # exits for gfair if it asked for the GPUs back; else marks completion

Each optimizer step is reported as a mini-batch done (`state.global_step`). When gfair asks the
job to yield, the callback has the Trainer save its full checkpoint (model, optimizer,
scheduler, RNG, trainer state) at the end of that step and stop; the saved directory is taken
into a gfair checkpoint, `finish` exits with the yield code, and the next start resumes from it
through `resume_path`. Needs ``pip install gfair[huggingface]``; one process per job.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from gfair.sdk.job import Job

CHECKPOINT_DIR = "trainer"


class GfairTrainerCallback(TrainerCallback):  # type: ignore[misc]
    def __init__(self, job: Job | None = None) -> None:
        self.job = job if job is not None else Job.from_env()
        self.yielded = False
        self._yielding = False

    def resume_path(self) -> str | None:
        """The Trainer checkpoint to resume from (`train(resume_from_checkpoint=...)`)."""
        self.job.load_checkpoint()
        restored = self.job.restored
        if restored is None or not (restored.path / CHECKPOINT_DIR).is_dir():
            return None
        return str(restored.path / CHECKPOINT_DIR)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        done = int(state.global_step)
        if done > self.job.steps_done:
            self.job.report(done - 1)
        if not self._yielding and not self.yielded and self.job.should_yield():
            # The Trainer saves a full checkpoint after this step (on_save takes it), then stops.
            self._yielding = True
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if not self._yielding:
            return control
        done = int(state.global_step)
        saved = Path(args.output_dir) / f"checkpoint-{done}"
        with self.job.checkpoint({"step": done}, step=done) as directory:
            shutil.copytree(saved, directory / CHECKPOINT_DIR)
        self._yielding = False
        self.yielded = True
        return control

    def finish(self) -> None:
        """After `train`: exit for the yield gfair asked for, or say the training completed."""
        if self.yielded:
            self.job.exit_for_yield()
        self.job.complete()
