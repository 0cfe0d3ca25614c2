"""Launching and stopping runs of jobs on this node's GPUs, through the user's supervisor.

Each operation returns once its effect is complete *and reported*: a launch once the run's
`started`/`resumed` is published (holding the job's events in the sink, so no report of the run
can precede it), a stop once the report relay has handled the run's exit (so its last checkpoint is
published before whatever the caller announces next).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import anyio.to_thread
import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace

from gfair.events import jobs as events
from gfair.events.commands import PrepareCommand, StartCommand
from gfair.events.envelope import Envelope
from gfair.events.fields import MAX_STDERR_TAIL_CHARS, JobRef
from gfair.events.reasons import SuspendReason
from gfair.node import lifecycle
from gfair.node.gpu import GpuDevice
from gfair.node.job_host import JobHost
from gfair.node.job_runner import JobStartError
from gfair.node.launch import CheckpointRef, RunSpec
from gfair_services.node_executor.event_sink import EventSink
from gfair_services.node_executor.launch_book import LaunchBook
from gfair_services.node_executor.local_job import LocalJob, RunStatus, RunTable, StopKind
from gfair_services.node_executor.settings import NodeExecutorSettings
from gfair_services.node_executor.user_supervisors import UserSupervisors

# What a shell answers for a command it cannot run; the failure detector reads it as the
# program's own failure (a missing interpreter or working directory is the submitter's).
CANNOT_START_EXIT_CODE = 127

_log = structlog.get_logger("gfair.services.node_executor")
_tracer = trace.get_tracer("gfair.services.node_executor")


class RunControl:
    def __init__(
        self,
        settings: NodeExecutorSettings,
        inventory: Mapping[int, GpuDevice],
        runs: RunTable,
        sink: EventSink,
        supervisors: UserSupervisors,
        host: JobHost,
    ) -> None:
        self._settings = settings
        self._node_id = settings.node_id
        self._inventory = inventory
        self._runs = runs
        self._sink = sink
        self._supervisors = supervisors
        self._host = host
        self.launches = LaunchBook(settings.work_dir / "launches")
        # Jobs a command is being carried out for now (commands run concurrently: `JobCommands`).
        self._commanded: Counter[JobRef] = Counter()

    @contextmanager
    def commanding(self, job: JobRef) -> Iterator[None]:
        """While a command of `job` runs: the parked-memory check leaves its run alone."""
        self._commanded[job] += 1
        try:
            yield
        finally:
            self._commanded[job] -= 1
            if not self._commanded[job]:
                del self._commanded[job]

    async def launch(self, cause: Envelope, command: StartCommand, generation: str) -> None:
        """Start the run, from the job's newest checkpoint when it has one."""
        commanded_at = time.time()
        checkpoints = self._settings.checkpoint_dir(command.user, command.job_id)
        await self._parked_elsewhere_gone(command, checkpoints)
        resume = self._host.latest_checkpoint(checkpoints)
        launch = _run_spec(
            command,
            generation,
            resume,
            gpu_indices=tuple(command.gpu_indices),
            gpu_uuids=tuple(self._inventory[i].uuid for i in command.gpu_indices),
        )
        self.launches.save(command)
        supervisor = await self._supervisors.get(command.user)
        began = time.monotonic()
        async with self._sink.holding(command.job):
            try:
                handle = await supervisor.start(launch)
            except (JobStartError, OSError) as exc:
                _log.warning("job could not start", job=str(command.job), error=str(exc))
                await self._sink.send(self._cannot_start(command, exc), cause=cause)
                return
            span = _tracer.start_span(
                "node_executor.run",
                start_time=int(handle.started_at * 1e9),
                attributes={
                    "gfair.user": command.user,
                    "gfair.job.id": command.job_id,
                    "gfair.node": self._node_id,
                    "gfair.gpus": len(command.gpu_indices),
                    "gfair.gpu.indices": list(command.gpu_indices),
                    "gfair.generation": generation,
                    "gfair.attempt": command.attempt,
                    **({"gfair.resumed_from": resume.step} if resume else {}),
                },
            )
            run = LocalJob(
                job=command.job,
                attempt=command.attempt,
                gpu_indices=tuple(command.gpu_indices),
                generation=generation,
                started_at=handle.started_at,
                start_event_id=cause.id,
                correlation_id=cause.correlation_id or cause.id,
                trace_context=trace.set_span_in_context(span),
                span=span,
                checkpoint_step=resume.step if resume else None,
                resumed_from=resume.step if resume else None,
                commanded_at=commanded_at,
                told=partial(supervisor.told, handle),
            )
            self._runs.put(run)
            token = otel_context.attach(run.trace_context)
            try:
                started = self.start_event(run, time.monotonic() - began)
                await self._sink.send(started, cause=cause)
            finally:
                otel_context.detach(token)
        _log.info(
            "job started",
            job=str(command.job),
            attempt=command.attempt,
            gpus=list(command.gpu_indices),
            generation=generation,
            resumed_from_step=resume.step if resume else None,
        )

    async def prepare(self, cause: Envelope, command: PrepareCommand, generation: str) -> None:
        """Start a prepared run: its process without GPUs, which parks in `Job.from_env()`;
        once it has, it is reported parked in place (`JobSuspended`, reason `prepared`), and a
        start here resumes it on the GPUs the start names. Returns once the process exists:
        the wait for its park goes on in a task of its own (`until_prepared`)."""
        checkpoints = self._settings.checkpoint_dir(command.user, command.job_id)
        resume = self._host.latest_checkpoint(checkpoints)
        launch = _run_spec(command, generation, resume, prepared_gpus=command.gpus)
        supervisor = await self._supervisors.get(command.user)
        async with self._sink.holding(command.job):
            try:
                handle = await supervisor.start(launch)
            except (JobStartError, OSError) as exc:
                # Nothing is lost: the job starts normally when its turn comes (and fails
                # then, reported, if it cannot start at all).
                _log.warning("prepared start failed", job=str(command.job), error=str(exc))
                return
            run = LocalJob(
                job=command.job,
                attempt=command.attempt,
                gpu_indices=(),
                generation=generation,
                started_at=handle.started_at,
                start_event_id=cause.id,
                correlation_id=cause.correlation_id or cause.id,
                trace_context=otel_context.get_current(),
                status=RunStatus.PREPARING,
                checkpoint_step=resume.step if resume else None,
                resumed_from=resume.step if resume else None,
                commanded_at=time.time(),
                told=partial(supervisor.told, handle),
            )
            self._runs.put(run)
        run.preparing = asyncio.create_task(
            self._until_parked(cause, run), name=f"prepare-{command.job}"
        )
        _log.info("job started prepared", job=str(command.job), attempt=command.attempt)

    async def until_prepared(self, run: LocalJob) -> None:
        """Wait until a prepared run parked or ended, as long as a parked one may take to
        resume (`resume_timeout_s`): a start waits no longer, since this node's other commands
        queue behind it. Past that the process is killed, and the start launches anew."""
        if run.preparing is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(run.preparing), self._settings.resume_timeout_s)
        except TimeoutError:
            if run.status is RunStatus.PREPARING:
                await self.kill_run(run, "given GPUs before it was ready")

    async def _until_parked(self, cause: Envelope, run: LocalJob) -> None:
        try:
            await self._report_park(cause, run)
        except Exception as exc:  # a task of its own: nobody else would hear of it
            _log.error(
                "waiting for a prepared job to park failed", job=str(run.job), error=repr(exc)
            )

    async def _report_park(self, cause: Envelope, run: LocalJob) -> None:
        supervisor = await self._supervisors.get(run.job.user)
        began = time.monotonic()
        outcome = await supervisor.until_parked(run.job.job_id, self._settings.prepare_timeout_s)
        async with self._sink.holding(run.job):
            if run.status is not RunStatus.PREPARING or run.stop is not None:
                return  # stopped meanwhile, or it ended on its own (the relay reports that)
            if outcome == "parked":
                run.status = RunStatus.PARKED
                parked = events.JobSuspended(
                    user=run.job.user,
                    job_id=run.job.job_id,
                    node_id=self._node_id,
                    attempt=run.attempt,
                    reason=SuspendReason.PREPARED,
                    checkpoint_step=run.checkpoint_step,
                    duration_s=time.monotonic() - began,
                    in_place=True,
                )
                await self._sink.send(parked, cause=cause)
        if outcome == "parked":
            _log.info(
                "prepared job parked", job=str(run.job), took_s=round(time.monotonic() - began, 3)
            )
            await self.within_parked_memory()
        elif outcome == "timeout":
            # Not an exit of the job's own (nothing is reported): it starts anew when its turn
            # comes. Its owner reads why in the node's log.
            _log.warning(
                "prepared job did not park in Job.from_env() in time: killed; it starts "
                "normally when it is given GPUs",
                job=str(run.job),
                timeout_s=self._settings.prepare_timeout_s,
            )
            await self.kill_run(
                run,
                f"did not park within {self._settings.prepare_timeout_s:g}s of a prepared start",
            )

    async def yield_run(
        self,
        run: LocalJob,
        cause_id: str | None,
        grace_s: float | None = None,
        *,
        park: bool = False,
    ) -> lifecycle.SuspendResult | None:
        """Checkpoint and stop the run; None when it ended on its own instead (reported).

        With `park` the run may yield in place instead (its process waits in host memory,
        holding no GPU): the result then says `parked`. A parked run is told to checkpoint and
        exit. `grace_s` is the yield the scheduler asked for (its suspend command's): past it
        the run is killed outright, since another job waits for its GPUs. Without it (a drain,
        an old scheduler's command) the run has `suspend_timeout_s` and then SIGTERM's grace."""
        if run.status is RunStatus.PREPARING:
            # Not parked yet, so nothing of it is worth keeping: it goes at once.
            await self.kill_run(run, "let go before it was given GPUs")
            return None
        run.stop = StopKind.YIELD
        run.stop_event_id = cause_id
        supervisor = await self._supervisors.get(run.job.user)
        park = park and self._settings.parked_memory_bytes > 0
        # Stopped before its first mini-batch, it was still coming up (imports, loading its
        # checkpoint): the scheduler may start it next without GPUs first (a prepared start),
        # so that a start-up longer than a slice does not begin anew at every slice.
        run.stopped_starting = supervisor.coming_up(run.job.job_id)
        if grace_s is None:
            result = await supervisor.suspend(
                run.job.job_id, self._settings.suspend_timeout_s, park=park
            )
        else:
            result = await supervisor.suspend(run.job.job_id, grace_s, enforce=True, park=park)
        run.yield_grace_s = grace_s
        if result.parked:
            run.status = RunStatus.PARKED
            _log.info("job parked in place", job=str(run.job), took_s=round(result.switch_s, 3))
            # Its GPUs are free now: the caller reports it first, then `within_parked_memory`.
            return result
        await self._exit_handled(run)
        return result if run.status is RunStatus.STOPPED else None

    async def resume_in_place(
        self, cause: Envelope, run: LocalJob, attempt: int, gpu_indices: tuple[int, ...]
    ) -> bool:
        """Continue the parked run in its process (on `gpu_indices`: its own, or on simulated
        GPUs any); False when it cannot (the caller stops it and starts anew from its
        checkpoint)."""
        supervisor = await self._supervisors.get(run.job.user)
        async with self._sink.holding(run.job):
            took = await supervisor.resume_in_place(
                run.job.job_id,
                self._settings.resume_timeout_s,
                gpu_indices,
                tuple(self._inventory[i].uuid for i in gpu_indices),
            )
            if took is None:
                return False
            if not run.gpu_indices:
                # A prepared start's first slice: its time to a first mini-batch runs from now.
                run.commanded_at = time.time() - took
            run.gpu_indices = gpu_indices
            run.status = RunStatus.RUNNING
            run.stop = run.stop_event_id = None
            # Its first report of the slice goes out even while the node is busy (`ReportRelay`):
            # a short slice would otherwise show none of its progress.
            run.progress_sent_at = None
            run.start_event_id = cause.id
            run.attempt = attempt
            resumed = events.JobResumed(
                user=run.job.user,
                job_id=run.job.job_id,
                node_id=self._node_id,
                gpu_indices=run.gpu_indices,
                attempt=run.attempt,
                checkpoint_step=run.checkpoint_step,
                duration_s=took,
                in_place=True,
            )
            await self._sink.send(resumed, cause=cause)
        _log.info("job resumed in place", job=str(run.job), took_s=round(took, 3))
        return True

    async def within_parked_memory(self, parked_by: JobRef | None = None) -> None:
        """Over the node's budget for parked jobs, the longest-parked ones checkpoint and exit;
        not those a command is carried out for now, but for `parked_by`'s own (it calls)."""
        budget = self._settings.parked_memory_bytes
        parked: list[tuple[float, int, LocalJob]] = []
        runs = self._runs.parked()
        for user in {run.job.user for run in runs}:
            # One look at each tenant's parked processes (their memory is read from /proc).
            supervisor = await self._supervisors.get(user)
            found = {info.job_id: info for info in supervisor.parked()}
            for run in runs:
                info = found.get(run.job.job_id) if run.job.user == user else None
                if info is not None:
                    parked.append((info.since, info.rss_bytes, run))
        held = sum(rss for _, rss, _ in parked)
        for _, rss, run in sorted(parked, key=lambda p: p[0]):
            if held <= budget:
                break
            if run.job in self._commanded and run.job != parked_by:
                continue  # a command of its own is resuming or stopping it now
            _log.info("parked jobs over their memory budget: checkpointing", job=str(run.job))
            await self.yield_run(run, run.stop_event_id)
            held -= rss

    async def _parked_elsewhere_gone(self, command: StartCommand, checkpoints: Path) -> None:
        """A process of the job parked in place on another node holds state newer than its
        checkpoints until it has checkpointed (the scheduler told that node to let go): wait
        for its marker to go, within bounds (a node that died with it parked leaves it)."""
        run = self._runs.get(command.job)
        if run is not None and run.alive:
            return  # our own process; it was stopped before this start
        limit = time.monotonic() + self._settings.suspend_timeout_s + self._settings.term_grace_s
        # Polled: the marker is in a directory another node's job writes to (a shared volume).
        parked = self._host.parked_elsewhere
        while await anyio.to_thread.run_sync(parked, checkpoints) and time.monotonic() < limit:  # noqa: ASYNC110
            await asyncio.sleep(0.01)

    async def kill_run(self, run: LocalJob, reason: str) -> None:
        run.stop = StopKind.KILL
        supervisor = await self._supervisors.get(run.job.user)
        await supervisor.kill(run.job.job_id, reason)
        await self._exit_handled(run)
        run.told()  # (a kill is reported by no one)
        _log.info("job killed", job=str(run.job), reason=reason)

    async def still_running(self, run: LocalJob) -> bool:
        """Whether its process lives; if not, returns once its exit has been reported."""
        supervisor = await self._supervisors.get(run.job.user)
        if any(handle.job_id == run.job.job_id for handle in supervisor.running()):
            return True
        await self._exit_handled(run)
        return False

    async def _exit_handled(self, run: LocalJob) -> None:
        # The supervisor hands the exit to the relay before it returns; this only waits for
        # the relay to get to it. The bound guards against a relay that died.
        limit = self._settings.suspend_timeout_s + self._settings.term_grace_s + 10.0
        try:
            await asyncio.wait_for(run.exit_handled.wait(), limit)
        except TimeoutError:
            _log.error("exit of a stopped job never reached the relay", job=str(run.job))

    def start_event(self, run: LocalJob, took_s: float) -> events.JobStarted | events.JobResumed:
        common = {
            "user": run.job.user,
            "job_id": run.job.job_id,
            "node_id": self._node_id,
            "gpu_indices": run.gpu_indices,
            "attempt": run.attempt,
        }
        if run.resumed_from is None:
            return events.JobStarted(**common)
        return events.JobResumed(**common, checkpoint_step=run.resumed_from, duration_s=took_s)

    def _cannot_start(self, command: StartCommand, error: Exception) -> events.JobExited:
        return events.JobExited(
            user=command.user,
            job_id=command.job_id,
            node_id=self._node_id,
            attempt=command.attempt,
            exit_code=CANNOT_START_EXIT_CODE,
            runtime_s=0.0,
            stderr_tail=f"gfair node {self._node_id}: {error}"[-MAX_STDERR_TAIL_CHARS:],
        )


def _run_spec(
    command: StartCommand | PrepareCommand,
    generation: str,
    resume: CheckpointRef | None,
    *,
    gpu_indices: tuple[int, ...] = (),
    gpu_uuids: tuple[str, ...] = (),
    prepared_gpus: int | None = None,
) -> RunSpec:
    """What the supervisor runs for `command`: its launch on this node's GPUs."""
    return RunSpec(
        job_id=command.job_id,
        argv=tuple(command.command),
        gpu_indices=gpu_indices,
        generation=generation,
        attempt=command.attempt,
        env=dict(command.env),
        gpu_uuids=gpu_uuids,
        workdir=Path(command.working_dir) if command.working_dir else None,
        image=command.image,
        mounts=tuple(command.mounts),
        resume_from=resume,
        prepared_gpus=prepared_gpus,
    )
