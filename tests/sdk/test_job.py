from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gfair.sdk import YIELD_EXIT_CODE, CheckpointError, CheckpointStore, Job, JobEnvironment
from gfair.sdk.environment import (
    ENV_ATTEMPT,
    ENV_CHECKPOINT_DIR,
    ENV_CONTROL_DIR,
    ENV_GPU_GENERATION,
    ENV_JOB_ID,
    ENV_RESUME_CHECKPOINT,
    PARK_FILE,
    PARKED_MARKER,
    PROGRESS_FILE,
    YIELD_FILE,
)
from gfair.sdk.progress import ProgressRecord


@pytest.fixture(autouse=True)
def restore_sigusr1() -> Iterator[None]:
    before = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, before)


def managed_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        ENV_JOB_ID: "job-1",
        ENV_ATTEMPT: "2",
        ENV_CHECKPOINT_DIR: str(tmp_path / "ck"),
        ENV_CONTROL_DIR: str(tmp_path / "control"),
        ENV_GPU_GENERATION: "k80",
        **extra,
    }


def records(tmp_path: Path) -> list[ProgressRecord]:
    text = (tmp_path / "control" / PROGRESS_FILE).read_text()
    return [ProgressRecord.from_json(line) for line in text.splitlines()]


def test_works_without_any_gfair_environment(tmp_path: Path) -> None:
    with Job.from_env({}, local_root=tmp_path / "local") as job:
        assert not job.env.managed
        assert job.job_id == "local"
        assert job.load_checkpoint() is None
        for step in range(5):
            job.report(step)
        assert not job.should_yield()
        job.save_checkpoint({"step": 5, "note": "local"})
        job.complete()

    with Job.from_env({}, local_root=tmp_path / "local") as again:
        assert again.load_checkpoint() == {"step": 5, "note": "local"}
        assert again.steps_done == 5
    # Outside gfair nothing but checkpoints is written.
    assert [p.name for p in (tmp_path / "local").iterdir()] == ["checkpoints"]


def test_environment_round_trips_and_bad_values_are_named() -> None:
    env = JobEnvironment(
        job_id="j",
        attempt=3,
        checkpoint_dir=Path("/ck/j"),
        control_dir=Path("/run/j/control"),
        gpu_generation="v100",
        resume_checkpoint=Path("/ck/j/ckpt-000000000004"),
        managed=True,
    )
    assert JobEnvironment.from_environ(env.to_environ()) == env
    with pytest.raises(ValueError, match=ENV_CONTROL_DIR):
        JobEnvironment.from_environ({ENV_JOB_ID: "j", ENV_CHECKPOINT_DIR: "/ck"})
    with pytest.raises(ValueError, match=ENV_ATTEMPT):
        JobEnvironment.from_environ({**env.to_environ(), ENV_ATTEMPT: "two"})


def test_managed_job_writes_progress_records(tmp_path: Path) -> None:
    with Job.from_env(managed_env(tmp_path)) as job:
        assert (job.job_id, job.attempt, job.gpu_generation) == ("job-1", 2, "k80")
        job.report(0)
        job.report(1)
        saved = job.save_checkpoint({"loss": 0.5})
        job.complete()

    got = records(tmp_path)
    assert got[0].kind == "ready"
    assert got[0].pid == os.getpid()
    assert got[0].handles_sigusr1
    assert [(r.kind, r.step) for r in got[1:]] == [
        ("step", 1),
        ("step", 2),
        ("checkpoint", 2),  # step defaults to mini-batches done
        ("complete", 2),
    ]
    assert got[3].checkpoint_seq == saved.seq
    assert got[3].checkpoint_path == str(saved.path)


def test_should_yield_after_sigusr1(tmp_path: Path) -> None:
    with Job.from_env(managed_env(tmp_path)) as job:
        assert not job.should_yield()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert job.should_yield()
    # Closed, the job ignores a late yield request: the default action would kill it while it
    # winds down.
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGUSR1)


def test_previous_sigusr1_handler_still_runs(tmp_path: Path) -> None:
    seen: list[int] = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    with Job.from_env(managed_env(tmp_path)) as job:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert job.should_yield()
    assert seen == [signal.SIGUSR1]
    # Closing the job gives SIGUSR1 back to whoever had it.
    os.kill(os.getpid(), signal.SIGUSR1)
    assert seen == [signal.SIGUSR1, signal.SIGUSR1]


def test_should_yield_when_the_yield_file_appears(tmp_path: Path) -> None:
    with Job.from_env(managed_env(tmp_path), install_signal_handler=False) as job:
        assert not job.should_yield()
        (tmp_path / "control" / YIELD_FILE).write_text("{}")
        # The file is polled at most every 0.1 s; it must be noticed soon after.
        deadline = 50
        while not job.should_yield() and deadline:
            deadline -= 1
            time.sleep(0.01)
        assert job.should_yield()


def test_exit_for_yield_records_it_and_exits_with_tempfail(tmp_path: Path) -> None:
    job = Job.from_env(managed_env(tmp_path))
    job.report(9)
    job.save_checkpoint({"step": 10})
    with pytest.raises(SystemExit) as exited:
        job.exit_for_yield()
    assert exited.value.code == YIELD_EXIT_CODE == 75
    assert [r.kind for r in records(tmp_path)][-2:] == ["checkpoint", "yield"]


def test_resume_uses_the_newest_checkpoint_or_the_pinned_one(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ck")
    older = store.save({"step": 100}, step=100)
    store.save({"step": 200}, step=200)

    with Job.from_env(managed_env(tmp_path)) as job:
        assert job.load_checkpoint() == {"step": 200}
        assert job.steps_done == 200

    pinned = managed_env(tmp_path, **{ENV_RESUME_CHECKPOINT: str(older.path)})
    with Job.from_env(pinned) as job:
        assert job.load_checkpoint() == {"step": 100}
        assert job.restored is not None and job.restored.seq == older.seq


def test_a_pinned_checkpoint_that_is_gone_fails_loudly(tmp_path: Path) -> None:
    env = managed_env(
        tmp_path, **{ENV_RESUME_CHECKPOINT: str(tmp_path / "ck" / "ckpt-000000000009")}
    )
    with Job.from_env(env) as job, pytest.raises(CheckpointError, match="missing"):
        job.load_checkpoint()


def test_checkpoint_context_manager_stores_framework_files(tmp_path: Path) -> None:
    with Job.from_env(managed_env(tmp_path)) as job:
        with job.checkpoint({"epoch": 1}, step=30) as directory:
            (directory / "model.pt").write_bytes(b"tensor bytes")
        assert records(tmp_path)[-1].kind == "checkpoint"

    with Job.from_env(managed_env(tmp_path)) as job:
        assert job.load_checkpoint() == {"epoch": 1}
        assert job.restored is not None
        assert job.restored.file("model.pt").read_bytes() == b"tensor bytes"


@pytest.fixture
def restore_sigusr2() -> Iterator[None]:
    before = signal.getsignal(signal.SIGUSR2)
    yield
    signal.signal(signal.SIGUSR2, before)


def answer_later(control: Path, park: int, action: str, delay_s: float = 0.1) -> threading.Thread:
    """The executor's part: the answer file, then SIGUSR2 to the parked process."""

    def answer() -> None:
        time.sleep(delay_s)
        if action == "resume":  # the executor withdraws the yield it answers in place
            (control / YIELD_FILE).unlink()
        (control / PARK_FILE).write_text(json.dumps({"park": park, "action": action}))
        os.kill(os.getpid(), signal.SIGUSR2)

    thread = threading.Thread(target=answer)
    thread.start()
    return thread


def test_suspend_parks_in_place_and_resumes_when_answered(
    tmp_path: Path, restore_sigusr2: None
) -> None:
    moves: list[str] = []
    saves: list[int] = []
    control = tmp_path / "control"
    with Job.from_env(managed_env(tmp_path)) as job:
        job.register_state(lambda: moves.append("off"), lambda: moves.append("on"))
        job.report(6)
        (control / YIELD_FILE).write_text(json.dumps({"requested": True, "park": True}))
        os.kill(os.getpid(), signal.SIGUSR1)
        assert job.should_yield()
        thread = answer_later(control, 1, "resume")
        job.suspend(lambda: saves.append(job.steps_done))
        thread.join()
        assert not job.should_yield()  # answered in place: the request is spent
    assert moves == ["off", "on"] and saves == []
    kinds = [(r.kind, r.step, r.park) for r in records(tmp_path) if r.kind != "step"]
    assert kinds[-2:] == [("parked", 7, 1), ("resumed", 7, 1)]
    assert not (tmp_path / "ck" / PARKED_MARKER).exists()


def test_a_parked_job_told_to_leave_saves_and_exits_for_its_yield(
    tmp_path: Path, restore_sigusr2: None
) -> None:
    control = tmp_path / "control"
    job = Job.from_env(managed_env(tmp_path))
    job.report(2)
    (control / YIELD_FILE).write_text(json.dumps({"requested": True, "park": True}))
    thread = answer_later(control, 1, "exit")
    with pytest.raises(SystemExit) as exited:
        job.suspend(lambda: job.save_checkpoint({"step": 3}))
    thread.join()
    assert exited.value.code == YIELD_EXIT_CODE
    assert CheckpointStore(tmp_path / "ck").latest().step == 3  # type: ignore[union-attr]
    assert [r.kind for r in records(tmp_path)][-2:] == ["checkpoint", "yield"]
    assert not (tmp_path / "ck" / PARKED_MARKER).exists()


def test_suspend_without_leave_to_park_checkpoints_and_exits(tmp_path: Path) -> None:
    # A yield file of an older executor, or one for a move: no "park".
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / YIELD_FILE).write_text(json.dumps({"requested": True}))
    moves: list[str] = []
    job = Job.from_env(managed_env(tmp_path))
    job.register_state(lambda: moves.append("off"), lambda: moves.append("on"))
    with pytest.raises(SystemExit) as exited:
        job.suspend(lambda: job.save_checkpoint({"step": 1}))
    assert exited.value.code == YIELD_EXIT_CODE and moves == []
    assert "parked" not in [r.kind for r in records(tmp_path)]


def test_may_park_says_whether_suspend_would_park(tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.mkdir()
    job = Job.from_env(managed_env(tmp_path))
    assert not job.may_park()  # nothing asked
    (control / YIELD_FILE).write_text(json.dumps({"requested": True}))
    assert not job.may_park()  # a move: save and exit
    (control / YIELD_FILE).write_text(json.dumps({"requested": True, "park": True}))
    assert job.may_park()
    local = Job.from_env({}, local_root=tmp_path / "local")
    assert not local.may_park()  # outside gfair nobody answers a park
