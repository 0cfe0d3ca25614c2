"""PyTorch Lightning through gfair: progress, yield and checkpoints in the trainer's hooks.

    from gfair.sdk.lightning_callback import GfairCallback

    gfair = GfairCallback()
    trainer = lightning.Trainer(max_steps=10_000, callbacks=[gfair])
    trainer.fit(model, data, ckpt_path=gfair.resume_path())
    gfair.finish()      # exits for gfair if it asked for the GPUs back; else marks completion

Each optimizer step is reported as a mini-batch done (`trainer.global_step`). When gfair asks
the job to yield, the callback acts at the end of that batch:

- Where gfair lets it park in place (a time slice that ends on this node), the LightningModule
  and the trainer's optimizers go to host memory (`Job.suspend`), the process waits holding no
  GPU, and `fit` goes on in the same process when gfair resumes it here: no checkpoint, no
  restart. If gfair instead wants it elsewhere while it waits (a move, a drain, the node's
  budget for parked jobs), it saves a full Lightning checkpoint (model, optimizers, loops) into
  a gfair checkpoint and exits with the yield code from inside `fit`: the `SystemExit` passes
  through Lightning's interrupt handling (callbacks' `on_exception`, loggers finalized as
  "failed", teardown) and ends the process; nothing after `fit` runs.
- Otherwise (a move or a drain of a running job, or outside a gfair executor) it saves that
  checkpoint and stops the trainer; `finish` then exits with the yield code.

Either way the next start resumes from the checkpoint through `resume_path`. Needs
``pip install gfair[lightning]``; one process per job (no DDP ranks).
"""

from __future__ import annotations

import functools
from typing import Any

import lightning.pytorch as pl

from gfair.sdk.job import Job
from gfair.sdk.parking import ignore_late_answers
from gfair.sdk.torch_state import TorchState, movable

CHECKPOINT_FILE = "lightning.ckpt"


class GfairCallback(pl.Callback):  # type: ignore[misc]
    def __init__(self, job: Job | None = None) -> None:
        super().__init__()
        self.job = job if job is not None else Job.from_env()
        self.yielded = False
        # What goes to host memory while parked: registered with the job at the first park,
        # pointed at the trainer's current module and optimizers at each.
        self._parked_state: TorchState | None = None

    def resume_path(self) -> str | None:
        """The Lightning checkpoint to resume from (`fit(ckpt_path=...)`), None to start fresh."""
        self.job.load_checkpoint()
        restored = self.job.restored
        if restored is None or not (restored.path / CHECKPOINT_FILE).is_file():
            return None
        return str(restored.path / CHECKPOINT_FILE)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        # Lightning saves the signal handlers after this hook and puts them back when `fit`
        # ends, also on the way out for a yield: SIGUSR2 must stay ignored then.
        ignore_late_answers()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        done = int(trainer.global_step)
        if done > self.job.steps_done:
            self.job.report(done - 1)
        if self.yielded or not self.job.should_yield():
            return
        if self.job.may_park():
            if self._parked_state is None:
                self._parked_state = TorchState()
                self.job.register_state(self._parked_state.offload, self._parked_state.restore)
            self._parked_state.track(*movable(pl_module, *trainer.optimizers))
            # Returns once resumed here; a "leave" answer saves and raises SystemExit.
            self.job.suspend(functools.partial(self._save, trainer, done))
            return
        self._save(trainer, done)
        self.yielded = True
        trainer.should_stop = True

    def finish(self) -> None:
        """After `fit`: exit for the yield gfair asked for, or say the training completed."""
        if self.yielded:
            self.job.exit_for_yield()
        self.job.complete()

    def _save(self, trainer: Any, done: int) -> None:
        with self.job.checkpoint({"step": done}, step=done) as directory:
            trainer.save_checkpoint(directory / CHECKPOINT_FILE)
