"""Virtual jobs: the synthetic training job without its process, for clusters of virtual nodes.

A node executor given a `VirtualHost` runs every job here instead of as an OS process: the
job's command line must be the synthetic job's (``python -m gfair.sdk.synthetic ...``), read
with that job's own parser and schedule (`gfair.sdk.synthetic`), so a virtual job trains at the
speed the real one would on the same GPUs (the Gavel table's), for as many mini-batches, and
fails where it would (--fail-at-step, --oom-at-step, a job type that does not fit), hangs
where it would (--hang-at-step) and ignores SIGTERM where it would. Its progress is computed
from the clock; no timer runs per mini-batch.

What it reports is what `JobSupervisor` reports for the real one, through the same `JobRunner`
interface (`job_host`): progress every `progress_interval_s`, a checkpoint every
--checkpoint-every mini-batches, at a yield and at the end, and one exit. A suspend is what
the synthetic job does with a yield request: it checkpoints after its current mini-batch and
exits (it never parks in place); past the suspend's timeout it is signalled as a process
would be, and keeps only its previous checkpoint.

Checkpoints hold a step and nothing else. The `VirtualHost` keeps each job's newest one in a
small file in the job's checkpoint directory (`VIRTUAL_CHECKPOINT`), so that a job suspended
on one virtual node resumes from its step on another, also when that node runs in another
process (virtual nodes are spread over several, `virtual_nodes_per_process`), as a real job
finds its checkpoint on the shared checkpoint root. Their paths, `<checkpoint dir>/ckpt-<seq>`,
are where the real one would be; nothing is written there (the services read steps, never
checkpoint files).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import io
import json
import math
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from gfair.node.job_runner import JobRunner, JobStartError, SupervisedRun, SupervisorConfig
from gfair.node.launch import CheckpointRef, JobPaths, RunningJob, RunSpec
from gfair.node.lifecycle import (
    CheckpointReport,
    ProgressReport,
    SuspendResult,
)
from gfair.sdk import synthetic
from gfair.sdk.environment import YIELD_EXIT_CODE
from gfair.sdk.throughput_table import ThroughputLookupError, ThroughputTable

SYNTHETIC_MODULE = "gfair.sdk.synthetic"
# A virtual job's newest checkpoint, in its checkpoint directory: {"seq", "step", "created_at"}.
VIRTUAL_CHECKPOINT = "virtual-checkpoint.json"


class VirtualHost:
    """Virtual jobs for every virtual node of a process, and their checkpoints (`JobHost`)."""

    def __init__(self, throughputs: ThroughputTable | None = None) -> None:
        self._table = throughputs

    @property
    def throughputs(self) -> ThroughputTable:
        if self._table is None:  # the packaged table, or $GFAIR_THROUGHPUTS; read once
            self._table = ThroughputTable.load()
        return self._table

    def runner(self, config: SupervisorConfig) -> VirtualSupervisor:
        return VirtualSupervisor(config, self)

    def latest_checkpoint(self, checkpoint_dir: Path) -> CheckpointRef | None:
        # Read every time: another process's virtual node may have written it since.
        try:
            saved = json.loads((checkpoint_dir / VIRTUAL_CHECKPOINT).read_bytes())
            seq, step, created_at = int(saved["seq"]), int(saved["step"]), saved["created_at"]
        except (OSError, ValueError, KeyError, TypeError):
            return None  # none yet, or unreadable: the job starts from its beginning
        return CheckpointRef(seq, step, checkpoint_dir / f"ckpt-{seq:012d}", float(created_at))

    def parked_elsewhere(self, checkpoint_dir: Path) -> bool:
        return False  # a virtual job never parks in place

    def commit(self, checkpoint_dir: Path, step: int) -> CheckpointRef:
        """A new checkpoint of the job at `step`, the newest from now on."""
        previous = self.latest_checkpoint(checkpoint_dir)
        seq = 1 if previous is None else previous.seq + 1
        ref = CheckpointRef(seq, step, checkpoint_dir / f"ckpt-{seq:012d}", time.time())
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        # Whole or not at all, as a real job's commit is: written aside, then renamed.
        target = checkpoint_dir / VIRTUAL_CHECKPOINT
        aside = target.with_name(f".{VIRTUAL_CHECKPOINT}.{os.getpid()}")
        aside.write_text(json.dumps({"seq": seq, "step": step, "created_at": ref.created_at}))
        aside.replace(target)
        return ref


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the command line makes of the job on its GPUs."""

    step_s: float  # wall seconds per mini-batch
    total: int
    checkpoint_every: int
    # The step at which it stops on its own other than by completing, and how.
    fail_at: int | None = None
    fail_code: int = 1
    fail_message: str = ""
    hang_at: int | None = None
    ignore_sigterm: bool = False
    # It exits with `fail_code` before its first mini-batch, wherever it would resume from.
    unrunnable: bool = False


@functools.cache
def _synthetic_parser() -> argparse.ArgumentParser:
    """Built once: a node starts hundreds of runs a quantum, and building it cost more than
    parsing with it (it measures the terminal, among other things)."""
    return synthetic.build_parser()


def _plan(launch: RunSpec, table: ThroughputTable) -> _Plan:
    argv = list(launch.argv)
    found = [i for i in range(len(argv) - 1) if argv[i] == "-m" and argv[i + 1] == SYNTHETIC_MODULE]
    if not found:
        raise JobStartError(
            f"job {launch.job_id}: a virtual node runs only `python -m {SYNTHETIC_MODULE}` "
            f"jobs, not {argv[0]!r}"
        )
    parser = _synthetic_parser()
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = parser.parse_args(argv[found[0] + 2 :])
    except SystemExit as exit_:
        return _failing(2 if exit_.code is None else int(exit_.code), errors.getvalue())
    if args.speed_scale <= 0:
        return _failing(2, "--speed-scale must be positive")
    generation = args.generation or launch.generation or synthetic.REFERENCE_GENERATION
    gpus = args.num_gpus or len(launch.gpu_indices) or 1
    try:
        rate, total = synthetic.schedule(
            args, generation, gpus, None if args.throughputs else table
        )
    except ThroughputLookupError as exc:
        return _failing(2, f"synthetic job: {exc}")
    if rate <= 0:
        return _failing(1, synthetic.oom_message(args.job_type, generation, gpus))
    fail_at, code, message = None, 1, ""
    if args.fail_at_step is not None:
        fail_at, code = args.fail_at_step, int(args.exit_code)
        message = f"synthetic job: injected failure at step {fail_at}"
    if args.oom_at_step is not None and (fail_at is None or args.oom_at_step <= fail_at):
        fail_at, code = args.oom_at_step, 1
        message = synthetic.oom_message(args.job_type, generation, gpus)
    return _Plan(
        step_s=1.0 / (rate * args.speed_scale),
        total=total,
        checkpoint_every=max(0, args.checkpoint_every),
        fail_at=fail_at,
        fail_code=code,
        fail_message=message,
        hang_at=args.hang_at_step,
        ignore_sigterm=args.ignore_sigterm,
    )


def _failing(code: int, message: str) -> _Plan:
    """A job that exits with `code` before its first mini-batch."""
    return _Plan(
        step_s=1.0, total=1, checkpoint_every=0, fail_code=code, fail_message=message,
        unrunnable=True,
    )  # fmt: skip


@dataclass(eq=False)
class _Run(SupervisedRun):
    plan: _Plan
    start_step: int
    news: asyncio.Event = field(default_factory=asyncio.Event)
    # The step after which it yields (its mini-batch under way when asked), once asked.
    yield_at: int | None = None
    signalled: int | None = None  # the signal that ends it, once sent
    emitted_steps: int = -1
    last_progress: float = -math.inf
    checkpoint_mark: int = 0  # the last --checkpoint-every multiple taken

    def time_of(self, step: int) -> float:
        return self.started_monotonic + (step - self.start_step) * self.plan.step_s

    def stop_step(self) -> int:
        """Where it stops making progress: its end, a failure, a hang, or the yield asked."""
        if self.plan.unrunnable:
            return self.start_step
        ends = [self.plan.total]
        for at in (self.plan.fail_at, self.plan.hang_at):
            if at is not None and at >= self.start_step:
                ends.append(at)
        end = min(ends)
        return end if self.yield_at is None else min(end, self.yield_at)

    def steps_at(self, now: float) -> int:
        done = self.start_step + int((now - self.started_monotonic) / self.plan.step_s)
        return max(self.start_step, min(done, self.stop_step()))


class VirtualSupervisor(JobRunner[_Run]):
    """One tenant's virtual jobs on one node: `JobSupervisor`'s interface, without processes."""

    def __init__(self, config: SupervisorConfig, host: VirtualHost) -> None:
        super().__init__(config)
        self._host = host

    async def _launch(self, launch: RunSpec) -> _Run:
        if launch.prepared_gpus is not None:
            # A virtual job has nothing to import: it starts when it is given GPUs.
            raise JobStartError(f"job {launch.job_id}: virtual jobs are not started prepared")
        plan = _plan(launch, self._host.throughputs)
        checkpoint_dir = self.config.checkpoint_root / launch.job_id
        resume = launch.resume_from or self._host.latest_checkpoint(checkpoint_dir)
        run_dir = self.config.run_root / launch.job_id / "virtual"
        handle = RunningJob(
            job_id=launch.job_id,
            attempt=launch.attempt,
            pid=0,
            pgid=0,
            gpu_indices=launch.gpu_indices,
            generation=launch.generation,
            started_at=time.time(),
            paths=JobPaths(
                run_dir=run_dir,
                workdir=launch.workdir or run_dir,
                control_dir=run_dir,
                stdout=run_dir / "stdout",
                stderr=run_dir / "stderr",
                checkpoint_dir=checkpoint_dir,
            ),
        )
        start_step = resume.step if resume is not None else 0
        run = _Run(
            handle=handle,
            started_monotonic=time.monotonic(),
            checkpoint=resume,
            steps=start_step,
            plan=plan,
            start_step=start_step,
        )
        if plan.checkpoint_every:
            run.checkpoint_mark = start_step - start_step % plan.checkpoint_every
        return run

    async def _suspend(
        self, run: _Run, timeout_s: float, *, enforce: bool, park: bool
    ) -> SuspendResult:
        """The synthetic job's yield: checkpoint after the mini-batch under way, then exit.
        `park` is not for it: it exits."""
        requested = time.monotonic()
        before = run.checkpoint
        if not run.yield_requested:
            run.yield_requested = True
            now_step = run.steps_at(requested)
            if run.plan.hang_at is None or now_step < run.plan.hang_at:
                run.yield_at = now_step + 1  # a hung job never gets to its yield
            run.news.set()
        with anyio.move_on_after(timeout_s):
            await run.exited.wait()
        return await self._force_off(
            run,
            timeout_s,
            enforce=enforce,
            before_seq=None if before is None else before.seq,
            requested_at=requested,
        )

    def _signal(self, run: _Run, signum: signal.Signals) -> None:
        if signum == signal.SIGTERM and run.plan.ignore_sigterm:
            return
        run.signalled = signum
        run.news.set()

    # ----- internals -------------------------------------------------------------------------

    async def _watch(self, run: _Run) -> None:
        """The job's life: reports as they fall due, then its exit."""
        try:
            while True:
                now = time.monotonic()
                done = run.steps_at(now)
                if run.signalled is not None:
                    await self._exit(run, done, exit_code=None, signum=run.signalled)
                    return
                await self._periodic_checkpoint(run, done)
                stop = run.stop_step()
                reached = done >= stop and now >= run.time_of(stop)
                if reached and await self._stopped_at(run, stop):
                    return
                self._progress(run, done, now)
                wake = run.last_progress + self.config.progress_interval_s
                if stop != run.plan.hang_at:
                    wake = min(wake, run.time_of(stop))
                every = run.plan.checkpoint_every
                if every:
                    wake = min(wake, run.time_of(run.checkpoint_mark + every))
                run.news.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(run.news.wait(), max(0.0, wake - now) + 1e-4)
        except asyncio.CancelledError:
            # Shielded: a cancelled runner still reports the exit of what it stops.
            with anyio.CancelScope(shield=True):
                if not run.exited.is_set():
                    await self._exit(run, run.steps_at(time.monotonic()), None, signal.SIGKILL)
            raise

    async def _stopped_at(self, run: _Run, stop: int) -> bool:
        """What it does on reaching `stop`; whether it exited."""
        plan = run.plan
        if plan.unrunnable:
            await self._exit(run, stop, plan.fail_code, None, stderr=plan.fail_message)
            return True
        if run.yield_at is not None and stop == run.yield_at:
            await self._commit(run, stop)
            await self._exit(run, stop, exit_code=YIELD_EXIT_CODE, signum=None)
            return True
        if stop == plan.hang_at and (plan.fail_at is None or plan.hang_at < plan.fail_at):
            return False  # hangs until signalled
        if plan.fail_at is not None and stop == plan.fail_at and stop < plan.total:
            await self._exit(run, stop, plan.fail_code, None, stderr=plan.fail_message)
            return True
        await self._commit(run, plan.total)
        await self._exit(run, plan.total, exit_code=0, signum=None, completed=True)
        return True

    async def _periodic_checkpoint(self, run: _Run, done: int) -> None:
        every = run.plan.checkpoint_every
        if not every or done < run.checkpoint_mark + every:
            return
        run.checkpoint_mark = done - done % every
        if run.checkpoint_mark < run.plan.total:
            await self._commit(run, run.checkpoint_mark)

    async def _commit(self, run: _Run, step: int) -> None:
        """The job saves a checkpoint at `step` and says so."""
        ref = self._host.commit(run.handle.paths.checkpoint_dir, step)
        run.checkpoint = ref
        job = run.handle
        await self._deliver(CheckpointReport(job.job_id, job.attempt, ref.created_at, ref))

    def _progress(self, run: _Run, done: int, now: float) -> None:
        if done <= run.start_step or done == run.emitted_steps:
            return
        if now - run.last_progress < self.config.progress_interval_s:
            return
        run.last_progress, run.emitted_steps = now, done
        elapsed = now - run.started_monotonic
        report = ProgressReport(
            job_id=run.handle.job_id,
            attempt=run.handle.attempt,
            time=time.time(),
            steps=done,
            rate_per_s=1.0 / run.plan.step_s,
            window_s=min(self.config.rate_window_s, elapsed),
            checkpoint_step=run.checkpoint.step if run.checkpoint else None,
            first_step_at=run.handle.started_at + run.plan.step_s,
        )
        self._emit_progress(report)

    async def _exit(
        self,
        run: _Run,
        steps: int,
        exit_code: int | None,
        signum: int | None,
        *,
        stderr: str = "",
        completed: bool = False,
    ) -> None:
        run.steps = steps
        exited = run.settle(
            exit_code, signum, stderr[-self.config.stderr_tail_bytes :], completed=completed
        )
        self._exited(run)
        try:
            await self._deliver(exited)
        finally:
            run.exited.set()
