"""A tiny regression trained by PyTorch Lightning or the Hugging Face Trainer through gfair's
callbacks (run by tests/e2e/test_framework_training.py, on the CPU).

    python framework_job.py {lightning,transformers} --steps N [--slow-until PATH]

Every mini-batch is a pure function of its step, so a run that was parked, moved and resumed
trains on exactly the batches of an uninterrupted one. At the end it saves the model's and the
optimizer's state (`final.pt`) in a gfair checkpoint of the last step. `--slow-until` sleeps
after each step until PATH exists: the test holds the job back until it has seen enough
switches, then lets it run to the end (what it computes does not depend on it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

from gfair.sdk import Job

FINAL_FILE = "final.pt"
BATCH = 16
FEATURES = 8


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    inputs = torch.randn(BATCH, FEATURES, generator=generator)
    return inputs, inputs.sum(dim=1, keepdim=True).sin()


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
    )


def optimizer(parameters: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(parameters, lr=0.05, momentum=0.9)


class Pace:
    def __init__(self, until: Path | None, sleep_s: float) -> None:
        self._until = until
        self._sleep_s = sleep_s

    def step(self) -> None:
        if self._until is not None:
            if self._until.exists():
                self._until = None
            else:
                time.sleep(self._sleep_s)


def save_final(job: Job, step: int, net: torch.nn.Module, optim: Any) -> None:
    with job.checkpoint({"step": step}, step=step) as directory:
        torch.save(
            {"model": net.state_dict(), "optimizer": optim.state_dict()}, directory / FINAL_FILE
        )


def lightning_main(steps: int, pace: Pace) -> None:
    import lightning.pytorch as pl

    from gfair.sdk.lightning_callback import GfairCallback

    class Regression(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = model()

        def training_step(self, _: Any, batch_idx: int) -> Any:
            pace.step()
            inputs, targets = batch(self.global_step)  # the step's batch, whatever the loader
            return torch.nn.functional.mse_loss(self.net(inputs), targets)

        def configure_optimizers(self) -> Any:
            return optimizer(self.parameters())

    gfair = GfairCallback()
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        callbacks=[gfair],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir="lightning",
    )
    regression = Regression()
    loader = torch.utils.data.DataLoader(range(steps), batch_size=None)
    trainer.fit(regression, loader, ckpt_path=gfair.resume_path())
    if not gfair.yielded:  # else it saved where it stopped, and `finish` exits for the yield
        save_final(gfair.job, steps, regression.net, trainer.optimizers[0])
    gfair.finish()


def transformers_main(steps: int, pace: Pace) -> None:
    import transformers

    from gfair.sdk.trainer_callback import GfairTrainerCallback

    class Regression(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = model()

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            pace.step()
            return {"loss": torch.nn.functional.mse_loss(self.net(x), labels)}

    class Rows(torch.utils.data.Dataset[dict[str, torch.Tensor]]):  # type: ignore[misc]
        """Row `i` is row `i % BATCH` of step `i // BATCH`'s batch."""

        def __len__(self) -> int:
            return steps * BATCH

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            inputs, targets = batch(index // BATCH)
            return {"x": inputs[index % BATCH], "labels": targets[index % BATCH]}

    args = transformers.TrainingArguments(
        output_dir="hf",
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        learning_rate=0.05,
        lr_scheduler_type="linear",
        optim="sgd",
        optim_args="momentum=0.9",
        weight_decay=0.0,
        max_grad_norm=0.0,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        logging_strategy="no",
    )
    regression = Regression()
    trainer = transformers.Trainer(model=regression, args=args, train_dataset=Rows())
    gfair = GfairTrainerCallback().attach(trainer)
    trainer.train(resume_from_checkpoint=gfair.resume_path())
    if not gfair.yielded:
        save_final(gfair.job, steps, regression.net, trainer.optimizer)
    gfair.finish()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=["lightning", "transformers"])
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--slow-until", type=Path)
    parser.add_argument("--sleep-s", type=float, default=0.05)
    args = parser.parse_args()
    pace = Pace(args.slow_until, args.sleep_s)
    if args.framework == "lightning":
        lightning_main(args.steps, pace)
    else:
        transformers_main(args.steps, pace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
