"""PyTorch Lightning through gfair: progress, yield and checkpoints in the trainer's hooks.

    from gfair.sdk.lightning_callback import GfairCallback

    gfair = GfairCallback()
    trainer = lightning.Trainer(max_steps=10_000, callbacks=[gfair])
    trainer.fit(model, data, ckpt_path=gfair.resume_path())
    gfair.finish()      # exits for gfair if it asked for the GPUs back; else marks completion

Each optimizer step is reported as a mini-batch done (`trainer.global_step`). When gfair asks
the job to yield (a suspend or a migration), the callback saves a full Lightning checkpoint
(model, optimizers, loops) into a gfair checkpoint at the end of that batch and stops the
trainer; `finish` then exits with the yield code, and the next start resumes from it through
`resume_path`. Needs ``pip install gfair[lightning]``; one process per job (no DDP ranks).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from gfair.sdk.job import Job

CHECKPOINT_FILE = "lightning.ckpt"


class GfairCallback(pl.Callback):  # type: ignore[misc]
    def __init__(self, job: Job | None = None) -> None:
        super().__init__()
        self.job = job if job is not None else Job.from_env()
        self.yielded = False

    def resume_path(self) -> str | None:
        """The Lightning checkpoint to resume from (`fit(ckpt_path=...)`), None to start fresh."""
        self.job.load_checkpoint()
        restored = self.job.restored
        if restored is None or not (restored.path / CHECKPOINT_FILE).is_file():
            return None
        return str(restored.path / CHECKPOINT_FILE)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        done = int(trainer.global_step)
        if done > self.job.steps_done:
            self.job.report(done - 1)
        if self.yielded or not self.job.should_yield():
            return
        with self.job.checkpoint({"step": done}, step=done) as directory:
            trainer.save_checkpoint(directory / CHECKPOINT_FILE)
        self.yielded = True
        trainer.should_stop = True

    def finish(self) -> None:
        """After `fit`: exit for the yield gfair asked for, or say the training completed."""
        if self.yielded:
            self.job.exit_for_yield()
        self.job.complete()
