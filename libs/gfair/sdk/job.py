"""The handle a training script holds: resume, report mini-batches, checkpoint, yield.

Step convention: `report(i)` says mini-batch `i` (0-based) has finished, so `i + 1` mini-batches
are done; a checkpoint's `step` is the number of mini-batches done, i.e. where to resume.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

from gfair.sdk.checkpoint import (
    Checkpoint,
    CheckpointStore,
    FileWriter,
    read_checkpoint,
)
from gfair.sdk.environment import (
    PARK_FILE,
    PARKED_MARKER,
    PROGRESS_FILE,
    YIELD_EXIT_CODE,
    YIELD_FILE,
    JobEnvironment,
)
from gfair.sdk.parking import granted_environment, wait_for_answer
from gfair.sdk.progress import ProgressLog, ProgressRecord
from gfair.sdk.yield_request import YieldRequest


class Job:
    def __init__(
        self,
        env: JobEnvironment,
        *,
        install_signal_handler: bool = True,
        keep_checkpoints: int = 2,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.env = env
        self._clock = clock
        self._store = CheckpointStore(env.checkpoint_dir, keep=keep_checkpoints)
        control = env.control_dir
        self._progress = ProgressLog(control / PROGRESS_FILE if control is not None else None)
        self._yield = YieldRequest(
            control / YIELD_FILE if control is not None else None,
            install_handler=install_signal_handler,
        )
        self._restored: Checkpoint | None = None
        self._loaded = False
        self._done = 0
        self._parks = 0
        # (offload, restore) pairs: what moves the job's device state to host memory and back.
        self._state: list[tuple[Callable[[], object], Callable[[], object]]] = []
        # The newest mini-batch must reach the supervisor even when the script just returns.
        atexit.register(self._progress.flush)
        self._progress.append(
            ProgressRecord(
                kind="ready",
                time=clock(),
                pid=os.getpid(),
                handles_sigusr1=self._yield.handles_sigusr1,
            )
        )

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        local_root: Path | None = None,
        install_signal_handler: bool = True,
    ) -> Job:
        """The job as gfair started it; outside gfair a local one (checkpoints in ./.gfair).

        A job submitted with `prepare` may be started before it is given GPUs (none visible):
        then this waits, parked, holding no GPU, until gfair gives it some, sets
        `CUDA_VISIBLE_DEVICES` (in `os.environ`) to them and returns; or exits, when gfair
        lets it go before it ran (there is nothing to save). Call it before touching a GPU.
        """
        env = JobEnvironment.from_environ(environ, local_root=local_root)
        job = cls(env, install_signal_handler=install_signal_handler)
        if env.prepared and env.control_dir is not None:
            job._wait_for_gpus(env.control_dir)
        return job

    @property
    def job_id(self) -> str:
        return self.env.job_id

    @property
    def attempt(self) -> int:
        return self.env.attempt

    @property
    def gpu_generation(self) -> str | None:
        return self.env.gpu_generation

    @property
    def steps_done(self) -> int:
        """Mini-batches done: restored from the checkpoint, then advanced by `report`."""
        return self._done

    @property
    def restored(self) -> Checkpoint | None:
        """The checkpoint `load_checkpoint` resumed from (its `path` holds any framework files)."""
        return self._restored

    def load_checkpoint(self) -> dict[str, Any] | None:
        """State of the checkpoint to resume from, or None for a fresh start.

        gfair may name the checkpoint to resume from; if that one is unreadable this raises
        `CheckpointError` rather than silently starting over. Otherwise the newest valid
        checkpoint is used, falling back to the previous one when the newest is damaged.
        """
        if not self._loaded:
            pinned = self.env.resume_checkpoint
            self._restored = read_checkpoint(pinned) if pinned else self._store.latest()
            self._loaded = True
            if self._restored is not None:
                self._done = max(self._done, self._restored.step)
        return dict(self._restored.state) if self._restored is not None else None

    def report(self, step: int) -> None:
        """Mini-batch `step` (0-based) has finished."""
        self._done = step + 1
        self._progress.step(self._done, self._clock())

    def should_yield(self) -> bool:
        """True once gfair asked this job to give its GPUs back (suspend or migrate)."""
        return self._yield.requested()

    def save_checkpoint(
        self,
        state: Mapping[str, Any],
        *,
        step: int | None = None,
        files: Mapping[str, FileWriter] | None = None,
    ) -> Checkpoint:
        """Durably save `state` (JSON) and optional files, each written by its writer callback.

        `step` defaults to `state["step"]`, else the mini-batches done so far.
        """
        resolved = self._resolve_step(state, step)
        checkpoint = self._store.save(state, step=resolved, files=files)
        self._announce(checkpoint)
        return checkpoint

    @contextlib.contextmanager
    def checkpoint(self, state: Mapping[str, Any], *, step: int | None = None) -> Iterator[Path]:
        """Yield a directory for framework files (e.g. torch.save into it); commit on exit."""
        with self._store.stage(state, step=self._resolve_step(state, step)) as draft:
            yield draft.path
        if draft.committed is not None:
            self._announce(draft.committed)

    def register_state(self, offload: Callable[[], object], restore: Callable[[], object]) -> None:
        """What `suspend` calls to move device state to host memory while parked, and back
        (restored in the reverse order of registration)."""
        self._state.append((offload, restore))

    def register_torch(self, *objects: Any) -> None:
        """Modules and optimizers whose tensors go to host memory while parked (and the CUDA
        allocator's cache is released); on the CPU there is nothing to move. Imports torch."""
        from gfair.sdk.torch_state import TorchState  # torch only for jobs that use it

        state = TorchState(*objects)
        self.register_state(state.offload, state.restore)

    def may_park(self) -> bool:
        """Whether the pending yield may park in place: `suspend` would wait here (and maybe
        return) rather than save and exit at once. For loops that yield another way when it
        may not (a framework's trainer stopped at its own pace, as before parking existed)."""
        return self.env.control_dir is not None and self._yield.park_allowed()

    def suspend(self, save: Callable[[], object]) -> None:
        """Give the GPUs back as gfair asked (after `should_yield()`, at a mini-batch boundary).

        Where gfair allows it (a time slice that ends on this node) the job parks in place: its
        registered state goes to host memory, it says so, and it waits, holding no GPU; this
        returns once gfair resumes it here, state moved back. Otherwise, or when gfair later
        wants it elsewhere (another node or other GPUs, a drain, a memory shortage on the node),
        `save()` writes its checkpoint and the job exits for the yield: no return.
        """
        control = self.env.control_dir
        if control is None or not self.may_park():
            save()
            self.exit_for_yield()
        self._parks += 1
        park = self._parks
        for offload, _ in self._state:
            offload()
        marker = self.env.checkpoint_dir / PARKED_MARKER
        with contextlib.suppress(OSError):
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(f"{os.getpid()}\n", encoding="utf-8")
        self._progress.append(
            ProgressRecord(kind="parked", time=self._clock(), step=self._done, park=park)
        )
        answer = wait_for_answer(control / PARK_FILE, park)
        if answer == "exit":
            save()
            with contextlib.suppress(OSError):
                marker.unlink()
            self.exit_for_yield()
        for _, restore in reversed(self._state):
            restore()
        self._yield.withdraw()
        with contextlib.suppress(OSError):
            marker.unlink()
        self._progress.append(
            ProgressRecord(kind="resumed", time=self._clock(), step=self._done, park=park)
        )

    def _wait_for_gpus(self, control: Path) -> None:
        """A prepared start: parked (the park protocol of `suspend`, with no state to move and
        no marker, since it has no state newer than its checkpoints) until gfair answers."""
        self._parks += 1
        park = self._parks
        self._progress.append(
            ProgressRecord(kind="parked", time=self._clock(), step=self._done, park=park)
        )
        answer = wait_for_answer(control / PARK_FILE, park)
        if answer == "exit":
            self.exit_for_yield()
        # Before anything of the job can initialise CUDA: a process reads these once.
        os.environ.update(granted_environment(control / PARK_FILE, park))
        self._progress.append(
            ProgressRecord(kind="resumed", time=self._clock(), step=self._done, park=park)
        )

    def exit_for_yield(self) -> NoReturn:
        """Tell gfair this exit is the requested yield, then exit (checkpoint first!)."""
        self._progress.append(ProgressRecord(kind="yield", time=self._clock(), step=self._done))
        self.close()
        raise SystemExit(YIELD_EXIT_CODE)

    def complete(self) -> None:
        """Training finished: the exit that follows is success, not a yield."""
        self._progress.append(ProgressRecord(kind="complete", time=self._clock(), step=self._done))
        self._progress.flush()

    def close(self) -> None:
        self._progress.close()
        self._yield.close()

    def __enter__(self) -> Job:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _resolve_step(self, state: Mapping[str, Any], step: int | None) -> int:
        if step is not None:
            return step
        from_state = state.get("step")
        if isinstance(from_state, int) and not isinstance(from_state, bool):
            return from_state
        return self._done

    def _announce(self, checkpoint: Checkpoint) -> None:
        self._progress.append(
            ProgressRecord(
                kind="checkpoint",
                time=self._clock(),
                step=checkpoint.step,
                checkpoint_seq=checkpoint.seq,
                checkpoint_path=str(checkpoint.path),
            )
        )
