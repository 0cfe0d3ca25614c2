"""The Lightning and Hugging Face Trainer callbacks with the real libraries, on CPU: a run that
gfair asks to yield mid-training checkpoints and exits with the yield code; the next run
resumes from that checkpoint, goes on from the same step and completes."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gfair.sdk.environment import YIELD_EXIT_CODE, JobEnvironment
from gfair.sdk.job import Job

torch = pytest.importorskip("torch")
# Base classes by names of type Any: where torch is installed, mypy reads `torch.nn.Module` in
# a class statement as the installed module's name, not as an attribute of this variable.
Module: Any = torch.nn.Module
Dataset: Any = torch.utils.data.Dataset

STEPS = 12
YIELD_AT = 5


def job(tmp_path: Path) -> Job:
    """The job as a gfair supervisor would start it (its control and checkpoint dirs)."""
    control = tmp_path / "control"
    control.mkdir(exist_ok=True)
    env = JobEnvironment.from_environ(
        {
            "GFAIR_JOB_ID": "train-1",
            "GFAIR_ATTEMPT": "1",
            "GFAIR_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
            "GFAIR_CONTROL_DIR": str(control),
        }
    )
    return Job(env)


def progress(tmp_path: Path) -> list[dict[str, Any]]:
    lines = (tmp_path / "control" / "progress.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def ask_to_yield() -> None:
    """What the supervisor does to suspend a job that handles SIGUSR1."""
    os.kill(os.getpid(), signal.SIGUSR1)


def steps(records: list[dict[str, Any]]) -> list[int]:
    return [r["step"] for r in records if r["kind"] == "step"]


def run_twice(tmp_path: Path, train: Callable[[Job, bool], int]) -> None:
    """First run asked to yield at YIELD_AT; second run resumes and completes. `train` returns
    how many batches the model trained on in that run."""
    first = job(tmp_path)
    with pytest.raises(SystemExit) as exited:
        train(first, True)
    assert exited.value.code == YIELD_EXIT_CODE
    first.close()
    before = progress(tmp_path)
    assert before[-1]["kind"] == "yield"
    (saved,) = [r for r in before if r["kind"] == "checkpoint"]
    assert saved["step"] == YIELD_AT  # saved at the end of the batch it was asked in
    assert steps(before) == list(range(1, YIELD_AT + 1))

    second = job(tmp_path)
    trained = train(second, False)
    second.close()
    after = progress(tmp_path)[len(before) :]
    assert after[-1]["kind"] == "complete"
    assert steps(after) == list(range(YIELD_AT + 1, STEPS + 1))  # on from where it stopped
    assert trained == STEPS - YIELD_AT  # the trainer resumed: it did not start over


def test_lightning_yields_through_a_checkpoint_and_resumes(tmp_path: Path) -> None:
    lightning = pytest.importorskip("lightning.pytorch")
    from gfair.sdk.lightning_callback import GfairCallback

    lightning_module: Any = lightning.LightningModule

    class Regression(lightning_module):  # type: ignore[misc]
        def __init__(self, yield_at: int | None) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.yield_at = yield_at
            self.batches = 0

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.batches += 1
            if self.global_step + 1 == self.yield_at:
                ask_to_yield()
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def train(job: Job, asked: bool) -> int:
        torch.manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        callback = GfairCallback(job)
        resume = callback.resume_path()
        assert (resume is None) == asked
        trainer = lightning.Trainer(
            max_steps=STEPS,
            accelerator="cpu",
            callbacks=[callback],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path / "lightning",
        )
        model = Regression(YIELD_AT if asked else None)
        trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4), ckpt_path=resume)
        callback.finish()
        return model.batches

    run_twice(tmp_path, train)


def test_hugging_face_trainer_yields_through_a_checkpoint_and_resumes(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from gfair.sdk.trainer_callback import GfairTrainerCallback

    class Regression(Module):  # type: ignore[misc]
        def __init__(self, yield_at: int | None) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.yield_at = yield_at
            self.calls = 0

        def forward(self, x: Any, labels: Any) -> dict[str, Any]:
            self.calls += 1
            if self.calls == self.yield_at:
                ask_to_yield()
            return {"loss": torch.nn.functional.mse_loss(self.layer(x), labels)}

    class Rows(Dataset):  # type: ignore[misc]
        def __init__(self) -> None:
            torch.manual_seed(0)
            self.x, self.y = torch.randn(64, 4), torch.randn(64, 1)

        def __len__(self) -> int:
            return 64

        def __getitem__(self, index: int) -> dict[str, Any]:
            return {"x": self.x[index], "labels": self.y[index]}

    def train(job: Job, asked: bool) -> int:
        callback = GfairTrainerCallback(job)
        resume = callback.resume_path()
        assert (resume is None) == asked
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "hf"),
            max_steps=STEPS,
            per_device_train_batch_size=4,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            logging_strategy="no",
        )
        model = Regression(YIELD_AT if asked else None)
        trainer = transformers.Trainer(
            model=model,
            args=args,
            train_dataset=Rows(),
            callbacks=[callback],
        )
        trainer.train(resume_from_checkpoint=resume)
        callback.finish()
        return model.calls

    run_twice(tmp_path, train)
