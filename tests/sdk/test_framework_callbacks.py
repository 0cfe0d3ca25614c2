"""The Lightning and Hugging Face Trainer callbacks with the real libraries, on CPU: a run that
gfair asks to yield mid-training checkpoints and exits with the yield code; the next run
resumes from that checkpoint, goes on from the same step and completes. Where gfair lets it
park in place, the run waits and goes on in the same process, or, told to leave, checkpoints
and exits from inside the trainer; the weights at the end are an uninterrupted run's."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gfair.node.run_directory import RunDirectory
from gfair.sdk.environment import YIELD_EXIT_CODE, JobEnvironment
from gfair.sdk.job import Job
from gfair.sdk.parking import ANSWER_SIGNAL
from training_state import equal

torch = pytest.importorskip("torch")
# Base classes by names of type Any: where torch is installed, mypy reads `torch.nn.Module` in
# a class statement as the installed module's name, not as an attribute of this variable.
Module: Any = torch.nn.Module
Dataset: Any = torch.utils.data.Dataset

STEPS = 12


@pytest.fixture(autouse=True)
def restore_signal_handlers() -> Iterator[None]:
    """Lightning puts back the handlers `fit` started with, a closed job's among them: the
    next test starts with the ones this one started with. SIGUSR2 starts at its default, as
    in a job's fresh process."""
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, ANSWER_SIGNAL)}
    signal.signal(ANSWER_SIGNAL, signal.SIG_DFL)
    yield
    for number, handler in before.items():
        signal.signal(number, handler)


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


def steps(records: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The first and last mini-batch of each run of steps between other records (the SDK
    samples those between: `gfair.sdk.progress`), checked to go up."""
    found: list[tuple[int, int]] = []
    run: list[int] = []
    for record in [*records, {"kind": "end"}]:
        if record["kind"] == "step":
            run.append(record["step"])
        elif run:
            assert run == sorted(set(run)), run
            found.append((run[0], run[-1]))
            run = []
    return found


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
    assert steps(before) == [(1, YIELD_AT)]

    second = job(tmp_path)
    trained = train(second, False)
    second.close()
    after = progress(tmp_path)[len(before) :]
    assert after[-1]["kind"] == "complete"
    assert steps(after) == [(YIELD_AT + 1, STEPS)]  # on from where it stopped
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


# Parking in place: a node executor's side played by a thread of the test, through the run
# directory's own writers (gfair.node.run_directory) and the signals the supervisor sends.

PARK_STEPS = 16


class Executor:
    """The executor of one run: asks for yields at given steps (parked or not) and answers each
    park in turn, as the node does: a resume withdraws the yield first, then answers; "exit"
    has the job checkpoint and leave."""

    def __init__(self, tmp_path: Path, run: int, answers: list[str]) -> None:
        self.run = RunDirectory.create(tmp_path / "runs", "train-1")
        assert self.run.path.name == f"run-{run:04d}"
        self._answers = list(answers)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._answer, daemon=True)

    def job(self, tmp_path: Path) -> Job:
        env = JobEnvironment.from_environ(
            {
                "GFAIR_JOB_ID": "train-1",
                "GFAIR_ATTEMPT": "1",
                "GFAIR_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
                "GFAIR_CONTROL_DIR": str(self.run.control_dir),
            }
        )
        return Job(env)

    def ask(self, *, park: bool) -> None:
        self.run.request_yield(park=park)
        os.kill(os.getpid(), signal.SIGUSR1)

    def records(self) -> list[dict[str, Any]]:
        """The job's progress records so far (whole lines: it may be writing the next)."""
        lines = self.run.progress_file.read_text().split("\n")[:-1]
        return [json.loads(line) for line in lines]

    def __enter__(self) -> Executor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _answer(self) -> None:
        answered = 0
        while not self._stop.wait(0.01):
            if not self.run.progress_file.exists():
                continue
            parks = [r["park"] for r in self.records() if r["kind"] == "parked"]
            for park in parks[answered : len(self._answers)]:  # the test checks their order
                action = self._answers[answered]
                if action == "resume":
                    self.run.withdraw_yield()
                self.run.answer_park(park, action)
                os.kill(os.getpid(), ANSWER_SIGNAL)
                answered += 1


def kinds(records: list[dict[str, Any]]) -> list[str]:
    """The records but steps, e.g. ready, parked, resumed, checkpoint, yield."""
    return [r["kind"] for r in records if r["kind"] != "step"]


Train = Callable[[Job, Executor | None, dict[int, bool]], tuple[int, dict[str, Any]]]


def park_resume_and_leave(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, train: Train) -> None:
    """Run 1 parks twice and resumes in place each time (one process, the trainer never
    stopped), then parks a third time and is told to leave: it checkpoints and exits with the
    yield code from inside the trainer. Run 2 resumes from that checkpoint and is asked to
    yield where it may not park (a move): it checkpoints and stops the trainer, as before
    parking existed. Run 3 resumes and completes with the weights and optimizer state of an
    uninterrupted run, bit for bit. `train(job, executor, asks)` returns the batches the
    model trained on in that run and the final state."""
    from gfair.sdk.torch_state import TorchState

    # On the CPU nothing moves: what each park would move is recorded instead.
    offloads: list[tuple[list[Any], list[Any]]] = []
    offload = TorchState.offload

    def recorded(state: TorchState) -> None:
        offloads.append((list(state._modules), list(state._optimizers)))
        offload(state)

    monkeypatch.setattr(TorchState, "offload", recorded)
    alone = Executor(tmp_path / "reference", 1, []).job(tmp_path / "reference")
    _, reference = train(alone, None, {})
    alone.close()

    with Executor(tmp_path, 1, ["resume", "resume", "exit"]) as first:
        job = first.job(tmp_path)
        with pytest.raises(SystemExit) as exited:
            train(job, first, {3: True, 6: True, 9: True})
        job.close()
    assert exited.value.code == YIELD_EXIT_CODE
    # On its way out a late duplicate answer must not kill it (the default action would).
    assert signal.getsignal(ANSWER_SIGNAL) == signal.SIG_IGN
    records = first.records()
    assert kinds(records) == [
        "ready", "parked", "resumed", "parked", "resumed", "parked", "checkpoint", "yield"
    ]  # fmt: skip
    parked = [r["step"] for r in records if r["kind"] == "parked"]
    assert parked == [3, 6, 9]
    # On after each resume, without a restart.
    assert steps(records) == [(1, 3), (4, 6), (7, 9)]
    (saved,) = [r for r in records if r["kind"] == "checkpoint"]
    assert saved["step"] == 9
    # Each park moved the model and the optimizer that trains it.
    assert len(offloads) == 3
    for modules, optimizers in offloads:
        (module,), (optimizer,) = modules, optimizers
        stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
        assert stepped == {id(p) for p in module.parameters()} != set()

    with Executor(tmp_path, 2, []) as second:
        job = second.job(tmp_path)
        with pytest.raises(SystemExit) as exited:
            train(job, second, {12: False})
        job.close()
    assert exited.value.code == YIELD_EXIT_CODE
    records = second.records()
    assert kinds(records) == ["ready", "checkpoint", "yield"]
    assert steps(records) == [(10, 12)]

    with Executor(tmp_path, 3, []) as third:
        job = third.job(tmp_path)
        trained, final = train(job, third, {})
        job.close()
    assert kinds(third.records()) == ["ready", "complete"]
    assert steps(third.records()) == [(13, PARK_STEPS)]
    assert trained == PARK_STEPS - 12
    assert equal(final, reference)


def step_batch(step: int) -> tuple[Any, Any]:
    """The mini-batch of `step`: the same whichever process trains it."""
    generator = torch.Generator().manual_seed(step)
    inputs = torch.randn(4, 4, generator=generator)
    return inputs, inputs.sum(dim=1, keepdim=True).sin()


def test_lightning_parks_in_place_resumes_and_leaves_through_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lightning = pytest.importorskip("lightning.pytorch")
    from gfair.sdk.lightning_callback import GfairCallback

    lightning_module: Any = lightning.LightningModule
    lightning_callback: Any = lightning.Callback

    class Regression(lightning_module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)
            self.batches = 0

        def training_step(self, _: Any, batch_idx: int) -> Any:
            self.batches += 1
            x, y = step_batch(self.global_step)
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    class Asker(lightning_callback):  # type: ignore[misc]
        def __init__(self, executor: Executor | None, asks: dict[int, bool]) -> None:
            self.executor, self.asks = executor, asks

        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            park = self.asks.get(trainer.global_step + 1)
            if park is not None and self.executor is not None:
                self.executor.ask(park=park)

    def train(
        job: Job, executor: Executor | None, asks: dict[int, bool]
    ) -> tuple[int, dict[str, Any]]:
        callback = GfairCallback(job)
        trainer = lightning.Trainer(
            max_steps=PARK_STEPS,
            accelerator="cpu",
            callbacks=[Asker(executor, asks), callback],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path / "lightning",
        )
        model = Regression()
        loader = torch.utils.data.DataLoader(range(PARK_STEPS), batch_size=None)
        trainer.fit(model, loader, ckpt_path=callback.resume_path())
        callback.finish()
        optimizer = trainer.optimizers[0].state_dict()
        return model.batches, {"model": model.state_dict(), "optimizer": optimizer}

    park_resume_and_leave(tmp_path, monkeypatch, train)


def test_hugging_face_trainer_parks_in_place_resumes_and_leaves_through_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from gfair.sdk.trainer_callback import CHECKPOINT_DIR, GfairTrainerCallback

    trainer_callback: Any = transformers.TrainerCallback

    class Regression(Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)
            self.calls = 0

        def forward(self, x: Any, labels: Any) -> dict[str, Any]:
            self.calls += 1
            return {"loss": torch.nn.functional.mse_loss(self.layer(x), labels)}

    class Rows(Dataset):  # type: ignore[misc]
        """Row `i` is row `i % 4` of step `i // 4`'s batch (in the order the sampler picks)."""

        def __len__(self) -> int:
            return PARK_STEPS * 4

        def __getitem__(self, index: int) -> dict[str, Any]:
            x, y = step_batch(index // 4)
            return {"x": x[index % 4], "labels": y[index % 4]}

    class Asker(trainer_callback):  # type: ignore[misc]
        def __init__(self, executor: Executor | None, asks: dict[int, bool]) -> None:
            self.executor, self.asks = executor, asks

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            park = self.asks.get(state.global_step + 1)
            if park is not None and self.executor is not None:
                self.executor.ask(park=park)

    def train(
        job: Job, executor: Executor | None, asks: dict[int, bool]
    ) -> tuple[int, dict[str, Any]]:
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "hf"),
            max_steps=PARK_STEPS,
            per_device_train_batch_size=4,
            learning_rate=0.05,
            optim="sgd",
            optim_args="momentum=0.9",
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            logging_strategy="no",
        )
        model = Regression()
        trainer = transformers.Trainer(
            model=model, args=args, train_dataset=Rows(), callbacks=[Asker(executor, asks)]
        )
        callback = GfairTrainerCallback(job).attach(trainer)
        resume = callback.resume_path()
        if resume is not None:  # a complete Trainer checkpoint, the scheduler's state too
            assert (Path(resume).parent / CHECKPOINT_DIR / "scheduler.pt").is_file()
        trainer.train(resume_from_checkpoint=resume)
        callback.finish()
        optimizer = trainer.optimizer.state_dict()
        return model.calls, {"model": model.state_dict(), "optimizer": optimizer}

    park_resume_and_leave(tmp_path, monkeypatch, train)
