"""Hugging Face `Trainer` through gfair: progress, yield and checkpoints in the trainer's hooks.

    from gfair.sdk.trainer_callback import GfairTrainerCallback

    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    gfair = GfairTrainerCallback().attach(trainer)
    trainer.train(resume_from_checkpoint=gfair.resume_path())
    gfair.finish()      # exits for gfair if it asked for the GPUs back; else marks completion

Each optimizer step is reported as a mini-batch done (`state.global_step`). When gfair asks the
job to yield, the callback acts at the end of that step:

- Where gfair lets it park in place (a time slice that ends on this node) and the callback is
  attached to its trainer, the model and optimizer go to host memory (`Job.suspend`), the
  process waits holding no GPU, and `train` goes on in the same process when gfair resumes it
  here: no checkpoint, no restart. If gfair instead wants it elsewhere while it waits (a move,
  a drain, the node's budget for parked jobs), the callback has the Trainer write its full
  checkpoint then and there (model, optimizer, scheduler, scaler, RNG, trainer and callback
  state: what `save_strategy` writes, by the method the Trainer saves with), takes it into a
  gfair checkpoint and exits with the yield code from inside `train` (`SystemExit`; nothing
  after `train` runs).
- Otherwise (a move or a drain of a running job, outside a gfair executor, or a callback only
  passed in `callbacks=[...]`, which cannot reach the trainer to save from inside a step) it has
  the Trainer save that checkpoint after the step and stop; the saved directory is taken into a
  gfair checkpoint and `finish` exits with the yield code.

Either way the next start resumes from it through `resume_path`. The Trainer's own copy stays
under `output_dir` (`checkpoint-<step>`, rotated by `save_total_limit`). Needs
``pip install gfair[huggingface]``; one process per job.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any, Self

from transformers import TrainerCallback

from gfair.sdk.job import Job
from gfair.sdk.torch_state import TorchState, movable

CHECKPOINT_DIR = "trainer"
# The Trainer's name for a checkpoint's directory under its output_dir.
TRAINER_CHECKPOINT_PREFIX = "checkpoint"


class GfairTrainerCallback(TrainerCallback):  # type: ignore[misc]
    def __init__(self, job: Job | None = None) -> None:
        self.job = job if job is not None else Job.from_env()
        self.yielded = False
        self.trainer: Any = None
        self._yielding = False
        # What goes to host memory while parked: registered with the job at the first park,
        # pointed at the trainer's current model and optimizer at each.
        self._parked_state: TorchState | None = None

    def attach(self, trainer: Any) -> Self:
        """Work with `trainer` (added to its callbacks unless there already): with it, a yield
        may park in place, since the callback can have it save its checkpoint mid-step."""
        if self not in trainer.callback_handler.callbacks:
            trainer.add_callback(self)
        self.trainer = trainer
        return self

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
        if self._yielding or self.yielded or not self.job.should_yield():
            return control
        if self._can_save_now() and self.job.may_park():
            if self._parked_state is None:
                self._parked_state = TorchState()
                self.job.register_state(self._parked_state.offload, self._parked_state.restore)
            self._parked_state.track(*movable(kwargs.get("model"), kwargs.get("optimizer")))
            # Returns once resumed here; a "leave" answer saves and raises SystemExit.
            self.job.suspend(functools.partial(self._save_now, done))
            return control
        # The Trainer saves a full checkpoint after this step (on_save takes it), then stops.
        self._yielding = True
        control.should_save = True
        control.should_training_stop = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if not self._yielding:
            return control
        done = int(state.global_step)
        self._take(Path(args.output_dir) / f"{TRAINER_CHECKPOINT_PREFIX}-{done}", done)
        self._yielding = False
        self.yielded = True
        return control

    def finish(self) -> None:
        """After `train`: exit for the yield gfair asked for, or say the training completed."""
        if self.yielded:
            self.job.exit_for_yield()
        self.job.complete()

    def _can_save_now(self) -> bool:
        """Attached to a Trainer that has the method it saves its checkpoints with."""
        save = getattr(self.trainer, "_save_checkpoint", None)
        return self.trainer is not None and callable(save)

    def _save_now(self, done: int) -> None:
        """The checkpoint the Trainer writes when `control.should_save` is set, written now."""
        trainer = self.trainer
        trainer._save_checkpoint(trainer.model, trial=None)
        self._take(Path(trainer.args.output_dir) / f"{TRAINER_CHECKPOINT_PREFIX}-{done}", done)

    def _take(self, saved: Path, done: int) -> None:
        with self.job.checkpoint({"step": done}, step=done) as directory:
            shutil.copytree(saved, directory / CHECKPOINT_DIR)
