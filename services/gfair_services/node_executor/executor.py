"""The node executor: one per GPU server, a thin shell over `gfair.node` and the bus.

It registers the server's GPUs, heartbeats, samples telemetry, and carries out the commands
on `gfair.cmd.<node_id>.*` with one worker, in order, so that a suspend has finished (its
checkpoint written, its GPUs free) before the next start on the same GPUs. Job processes are
run by one `JobSupervisor` per user (checkpoints under `<checkpoint_root>/<user>/<job_id>`);
what the supervisors report is relayed as job events.

Ordering of a job's events: a run's `started`/`resumed` is published before any of its reports
(the start and its announcement happen under the publish lock the relay also takes), and a
`suspended` or `migrated` after the run's last checkpoint (the command waits until the relay
has handled the run's exit). Events of a command carry ids derived from the command's, so a
redelivered command publishes nothing twice.

An exit the scheduler did not ask for is reported as `exited` for the failure detector to
classify; a stop it asked for is reported as `suspended`/`migrated` (or, for a kill, not at
all: whoever asked for the kill decided what comes next).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio.to_thread
import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace

import gfair
from gfair.bus.publisher import derived_event_id
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.service import Emit, Service, Unprocessable
from gfair.bus.topology import ConsumerSpec
from gfair.events import jobs as events
from gfair.events.commands import (
    KillCommand,
    MigrateCommand,
    NodeCommand,
    ResumeCommand,
    StartCommand,
    SuspendCommand,
)
from gfair.events.envelope import Envelope, EventData
from gfair.events.fields import MAX_STDERR_TAIL_CHARS, JobRef
from gfair.events.nodes import NodeHeartbeat, NodeRegistered, NodeTelemetry
from gfair.events.reasons import SuspendReason
from gfair.events.subjects import node_commands_pattern, stream_for_subject
from gfair.node import lifecycle
from gfair.node.discovery import open_gpus
from gfair.node.gpu import GpuBackend, GpuSample, XidError
from gfair.node.launch import CheckpointRef, JobLaunch
from gfair.node.orphans import ReapedRun
from gfair.node.supervisor import JobStartError, SupervisorConfig
from gfair.sdk.checkpoint import CheckpointStore
from gfair_services.node_executor.gpu_report import XidLog, inventory_event, telemetry_samples
from gfair_services.node_executor.launch_book import LaunchBook
from gfair_services.node_executor.local_job import LocalJob, RunStatus, StopKind
from gfair_services.node_executor.settings import NodeExecutorSettings
from gfair_services.node_executor.user_supervisors import UserSupervisors
from gfair_services.topology import cluster_topology

SERVICE_NAME = "node-executor"
# What a shell answers for a command it cannot run; the failure detector reads it as the
# program's own failure (a missing interpreter or working directory is the submitter's).
CANNOT_START_EXIT_CODE = 127

_log = structlog.get_logger("gfair.services.node_executor")
_tracer = trace.get_tracer("gfair.services.node_executor")

Command = StartCommand | SuspendCommand | ResumeCommand | MigrateCommand | KillCommand


class NodeExecutor:
    def __init__(
        self,
        settings: NodeExecutorSettings | None = None,
        *,
        gpus: GpuBackend | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings or NodeExecutorSettings()
        self.node_id = self.settings.node_id
        self._clock = clock
        # Opened first: a server that cannot see its GPUs must fail before it joins the cluster.
        self._gpus = gpus or open_gpus(self.settings.simulate_gpus, node_id=self.node_id)
        self._inventory = {gpu.index: gpu for gpu in self._gpus.inventory()}
        self._xids = XidLog(list(self._inventory.values()))
        self._launches = LaunchBook(self.settings.work_dir / "launches")
        self._supervisors = UserSupervisors(self._supervisor_config, self._relay)
        self._jobs: dict[JobRef, LocalJob] = {}
        self._publish_lock = asyncio.Lock()
        self._runtime: ServiceRuntime | None = None
        self._heartbeat_seq = 0
        self._closed = False
        self.service = self._build()

    def _build(self) -> Service:
        service = Service(SERVICE_NAME, topology=cluster_topology())
        pattern = node_commands_pattern(self.node_id)
        consumer = ConsumerSpec(
            stream=stream_for_subject(pattern).name,
            durable=f"node-executor-{self.node_id}",
            filter_subjects=(pattern,),
            description=f"commands for node {self.node_id}, handled one at a time in order",
        )
        service.on_start(self.start)
        # One worker: commands must take effect in the order the scheduler sent them.
        service.add_handler(self.on_command, consumer, name="command", workers=1)
        service.add_timer(self.settings.heartbeat_s, self.heartbeat, name="heartbeat")
        service.add_timer(self.settings.telemetry_s, self.telemetry, name="telemetry")
        return service

    def _supervisor_config(self, user: str) -> SupervisorConfig:
        return SupervisorConfig(
            node_id=self.node_id,
            run_root=self.settings.work_dir / "runs" / user,
            checkpoint_root=self.settings.checkpoint_root / user,
            gpu_indices=frozenset(self._inventory),
            term_grace_s=self.settings.term_grace_s,
            shutdown_timeout_s=self.settings.suspend_timeout_s,
            progress_interval_s=self.settings.progress_interval_s,
        )

    # ----- queries -----------------------------------------------------------------------

    def running(self) -> list[LocalJob]:
        return [job for job in self._jobs.values() if job.running]

    def job(self, user: str, job_id: str) -> LocalJob | None:
        return self._jobs.get(JobRef(user=user, job_id=job_id))

    # ----- start and stop ----------------------------------------------------------------

    async def start(self, runtime: ServiceRuntime) -> None:
        """Stop what an earlier executor of this node left running, then register."""
        self._runtime = runtime
        reaped = await self._supervisors.open_existing(self.settings.work_dir / "runs")
        inventory = [self._inventory[i] for i in sorted(self._inventory)]
        await runtime.publish(
            NodeRegistered(
                node_id=self.node_id,
                hostname=socket.gethostname()[:255] or self.node_id,
                gpus=inventory_event(inventory),
                heartbeat_interval_s=self.settings.heartbeat_s,
                simulated=any(gpu.simulated for gpu in inventory),
                executor_version=gfair.__version__,
            )
        )
        for user, run in reaped:
            await self._announce_reaped(user, run)
        _log.info(
            "node registered",
            node_id=self.node_id,
            gpus=len(inventory),
            generations=sorted({gpu.generation for gpu in inventory}),
            reaped=len(reaped),
        )

    async def _announce_reaped(self, user: str, run: ReapedRun) -> None:
        # The scheduler may still think it runs here: it is off its GPUs now, with its
        # checkpoint, exactly as after a drain, so the next quantum can start it again.
        _log.warning(
            "stopped a job an earlier executor left running",
            user=user,
            job_id=run.job_id,
            found_alive=run.found_alive,
            checkpoint_step=run.checkpoint.step if run.checkpoint else None,
        )
        await self._publish(
            events.JobSuspended(
                user=user,
                job_id=run.job_id,
                node_id=self.node_id,
                attempt=max(run.attempt, 1),
                reason=SuspendReason.DRAIN,
                checkpoint_step=run.checkpoint.step if run.checkpoint else None,
            ),
            key=f"{self.node_id}/reaped/{run.run_dir}",
        )

    async def close(self) -> None:
        """Checkpoint and stop every job (reported `suspended`, reason drain), then let go.

        Called on SIGTERM before the bus closes, so a restarted cluster resumes them.
        """
        if self._closed:
            return
        self._closed = True
        running = self.running()
        if running:
            _log.info("draining jobs", jobs=[str(job.job) for job in running])
        results = await asyncio.gather(
            *(self._drain(job) for job in running), return_exceptions=True
        )
        for job, result in zip(running, results, strict=True):
            if isinstance(result, BaseException):
                _log.error("drain failed", job=str(job.job), error=repr(result))
        await self._supervisors.close()
        self._gpus.close()

    async def _drain(self, job: LocalJob) -> None:
        key = f"{self.node_id}/drain/{job.job}/{job.attempt}/{job.started_at!r}"
        result = await self._yield(job, None)
        if result is not None:
            await self._publish(self._suspended(job, SuspendReason.DRAIN, result), key=key)

    # ----- commands ----------------------------------------------------------------------

    async def on_command(self, envelope: Envelope, command: Command) -> Sequence[Emit]:
        if command.node_id != self.node_id:
            raise Unprocessable(f"command for node {command.node_id} reached {self.node_id}")
        with _tracer.start_as_current_span(
            f"node_executor.{command.command_name()}",
            attributes={
                "gfair.user": command.user,
                "gfair.job_id": command.job_id,
                "gfair.server": self.node_id,
                "gfair.attempt": command.attempt,
            },
        ):
            if isinstance(command, StartCommand | ResumeCommand) and self._stale(envelope):
                return []
            if isinstance(command, StartCommand):
                await self._start(envelope, command)
            elif isinstance(command, ResumeCommand):
                await self._resume(envelope, command)
            elif isinstance(command, SuspendCommand):
                await self._suspend(envelope, command)
            elif isinstance(command, MigrateCommand):
                await self._migrate(envelope, command)
            else:
                await self._kill(command)
        # Published by the handler itself, in order with the relay (see the module doc).
        return []

    def _stale(self, envelope: Envelope) -> bool:
        age = self._clock() - envelope.time.timestamp()
        if age <= self.settings.command_max_age_s:
            return False
        # Sent before a long outage of this executor: the job has been re-placed meanwhile,
        # and starting it here would run it twice.
        _log.warning("stale start ignored", event_id=envelope.id, age_s=round(age, 1))
        return True

    def _current(self, command: NodeCommand) -> LocalJob | None:
        """This node's run of the job, unless the command is about an earlier attempt."""
        job = self._jobs.get(command.job)
        if job is not None and command.attempt < job.attempt:
            _log.info(
                "command for an earlier attempt ignored",
                job=str(command.job),
                command=command.command_name(),
                attempt=command.attempt,
                current=job.attempt,
            )
            raise _Superseded
        return job

    async def _start(self, envelope: Envelope, command: StartCommand) -> None:
        try:
            current = self._current(command)
        except _Superseded:
            return
        if current is not None and current.running and await self._still_running(current):
            same = sorted(current.gpu_indices) == sorted(command.gpu_indices)
            if same and command.attempt == current.attempt:
                if envelope.id == current.start_event_id:  # redelivered: announce again
                    await self._publish(self._start_event(current, 0.0), cause=envelope)
                return
            if command.attempt > current.attempt:
                await self._stop_killing(current, f"superseded by attempt {command.attempt}")
            else:
                moved = await self._yield(current, envelope.id)
                if moved is not None:
                    suspended = self._suspended(current, SuspendReason.TIME_SLICE, moved)
                    await self._publish(suspended, cause=envelope)
        generation = self._generation_of(command)
        expected = self.settings.checkpoint_dir(command.user, command.job_id)
        if Path(command.checkpoint_dir) != expected:
            raise Unprocessable(
                f"checkpoint dir {command.checkpoint_dir} is not {expected}: the scheduler's "
                f"checkpoint root differs from node {self.node_id}'s "
                f"({self.settings.checkpoint_root})"
            )
        for occupant in self._occupants(command):
            # Commands arrive in order, so the newest word on these GPUs is this start.
            _log.warning(
                "GPUs still held by another job: suspending it",
                job=str(occupant.job),
                gpus=sorted(set(occupant.gpu_indices) & set(command.gpu_indices)),
            )
            stopped = await self._yield(occupant, envelope.id)
            if stopped is not None:
                suspended = self._suspended(occupant, SuspendReason.TIME_SLICE, stopped)
                await self._publish(suspended, cause=envelope)
        await self._launch(envelope, command, generation, expected)

    async def _launch(
        self, envelope: Envelope, command: StartCommand, generation: str, checkpoints: Path
    ) -> None:
        latest = CheckpointStore(checkpoints).latest()
        resume = CheckpointRef.of(latest) if latest is not None else None
        launch = JobLaunch(
            job_id=command.job_id,
            argv=tuple(command.command),
            gpu_indices=tuple(command.gpu_indices),
            generation=generation,
            attempt=command.attempt,
            env=dict(command.env),
            gpu_uuids=tuple(self._inventory[i].uuid for i in command.gpu_indices),
            workdir=Path(command.working_dir) if command.working_dir else None,
            resume_from=resume,
        )
        self._launches.save(command)
        supervisor = await self._supervisors.get(command.user)
        began = time.monotonic()
        async with self._publish_lock:
            try:
                handle = await supervisor.start(launch)
            except (JobStartError, OSError) as exc:
                _log.warning("job could not start", job=str(command.job), error=str(exc))
                await self._send(
                    events.JobExited(
                        user=command.user,
                        job_id=command.job_id,
                        node_id=self.node_id,
                        attempt=command.attempt,
                        exit_code=CANNOT_START_EXIT_CODE,
                        runtime_s=0.0,
                        stderr_tail=f"gfair node {self.node_id}: {exc}"[-MAX_STDERR_TAIL_CHARS:],
                    ),
                    cause=envelope,
                )
                return
            job = LocalJob(
                job=command.job,
                attempt=command.attempt,
                gpu_indices=tuple(command.gpu_indices),
                generation=generation,
                started_at=handle.started_at,
                start_event_id=envelope.id,
                correlation_id=envelope.correlation_id or envelope.id,
                trace_context=otel_context.get_current(),
                checkpoint_step=resume.step if resume else None,
                resumed_from=resume.step if resume else None,
            )
            self._jobs[command.job] = job
            await self._send(self._start_event(job, time.monotonic() - began), cause=envelope)
        _log.info(
            "job started",
            job=str(command.job),
            attempt=command.attempt,
            gpus=list(command.gpu_indices),
            generation=generation,
            resumed_from_step=resume.step if resume else None,
        )

    async def _resume(self, envelope: Envelope, command: ResumeCommand) -> None:
        last = self._launches.load(command.job)
        if last is None:
            raise Unprocessable(
                f"node {self.node_id} never started {command.job}: a resume needs the job's "
                "command line from an earlier start here; send a start command instead"
            )
        start = last.model_copy(
            update={"gpu_indices": command.gpu_indices, "attempt": command.attempt}
        )
        await self._start(envelope, start)

    async def _suspend(self, envelope: Envelope, command: SuspendCommand) -> None:
        try:
            job = self._current(command)
        except _Superseded:
            return
        if job is not None and job.stop_event_id == envelope.id and not job.running:
            # Redelivered after it took effect: announce again, under the same id.
            suspended = self._suspended(job, command.reason, None)
            await self._publish(suspended, cause=envelope)
            return
        if job is None or not job.running:
            _log.info("suspend of a job not running here ignored", job=str(command.job))
            return
        result = await self._yield(job, envelope.id)
        if result is not None:
            await self._publish(self._suspended(job, command.reason, result), cause=envelope)

    async def _migrate(self, envelope: Envelope, command: MigrateCommand) -> None:
        try:
            job = self._current(command)
        except _Superseded:
            return
        if job is None or job.status is RunStatus.EXITED:
            _log.info("migrate of a job not here ignored", job=str(command.job))
            return
        if job.running:
            result = await self._yield(job, envelope.id)
            if result is None:
                return  # it ended on its own meanwhile; its exit was reported
            job.checkpoint_step = result.checkpoint.step if result.checkpoint else None
        # A job already suspended here needs nothing but the announcement: its checkpoint is
        # in the shared directory the target node reads.
        await self._publish(
            events.JobMigrated(
                user=command.user,
                job_id=command.job_id,
                from_node=self.node_id,
                to_node=command.to_node,
                reason=command.reason,
                attempt=job.attempt,
                checkpoint_step=job.checkpoint_step,
            ),
            cause=envelope,
        )

    async def _kill(self, command: KillCommand) -> None:
        try:
            job = self._current(command)
        except _Superseded:
            return
        if job is None or not job.running:
            _log.info("kill of a job not running here ignored", job=str(command.job))
            return
        await self._stop_killing(job, command.reason)

    # ----- stopping runs -----------------------------------------------------------------

    async def _yield(self, job: LocalJob, cause_id: str | None) -> lifecycle.SuspendResult | None:
        """Checkpoint and stop the run; None when it ended on its own instead (reported)."""
        job.stop = StopKind.YIELD
        job.stop_event_id = cause_id
        supervisor = await self._supervisors.get(job.job.user)
        result = await supervisor.suspend(job.job.job_id, self.settings.suspend_timeout_s)
        await self._exit_handled(job)
        return result if job.status is RunStatus.STOPPED else None

    async def _stop_killing(self, job: LocalJob, reason: str) -> None:
        job.stop = StopKind.KILL
        supervisor = await self._supervisors.get(job.job.user)
        await supervisor.kill(job.job.job_id, reason)
        await self._exit_handled(job)
        _log.info("job killed", job=str(job.job), reason=reason)

    async def _exit_handled(self, job: LocalJob) -> None:
        # The supervisor hands the exit to the relay before it returns; this only waits for
        # the relay to get to it. The bound guards against a relay that died.
        limit = self.settings.suspend_timeout_s + self.settings.term_grace_s + 10.0
        try:
            await asyncio.wait_for(job.exit_handled.wait(), limit)
        except TimeoutError:
            _log.error("exit of a stopped job never reached the relay", job=str(job.job))

    async def _still_running(self, job: LocalJob) -> bool:
        supervisor = await self._supervisors.get(job.job.user)
        if any(run.job_id == job.job.job_id for run in supervisor.running()):
            return True
        # It ended and its exit is on its way to the relay: let that be reported first.
        await self._exit_handled(job)
        return False

    def _occupants(self, command: StartCommand) -> list[LocalJob]:
        wanted = set(command.gpu_indices)
        return [
            job
            for job in self.running()
            if job.job != command.job and wanted & set(job.gpu_indices)
        ]

    def _generation_of(self, command: StartCommand) -> str:
        missing = sorted(set(command.gpu_indices) - set(self._inventory))
        if missing:
            raise Unprocessable(
                f"node {self.node_id} has no GPU {missing} (it has {sorted(self._inventory)})"
            )
        generations = {self._inventory[i].generation for i in command.gpu_indices}
        if len(generations) != 1:
            raise Unprocessable(
                f"GPUs {list(command.gpu_indices)} of node {self.node_id} mix generations "
                f"{sorted(generations)}: a gang runs on one generation"
            )
        return generations.pop()

    # ----- the relay of supervisor reports -----------------------------------------------

    async def _relay(self, user: str, report: lifecycle.JobEvent) -> None:
        job = self._jobs.get(JobRef(user=user, job_id=report.job_id))
        if isinstance(report, lifecycle.JobProgress):
            if job is None or not job.running or report.rate_per_s is None:
                return  # no rate yet (two reports make one), or a run already over
            await self._publish_for(
                job,
                events.JobProgress(
                    user=user,
                    job_id=report.job_id,
                    node_id=self.node_id,
                    generation=job.generation,
                    attempt=report.attempt,
                    minibatches_per_s=report.rate_per_s,
                    iterations=report.steps,
                    checkpoint_step=report.checkpoint_step,
                    window_s=report.window_s or None,
                ),
            )
        elif isinstance(report, lifecycle.JobCheckpointed):
            if job is not None:
                job.checkpoint_step = report.checkpoint.step
            checkpoint = report.checkpoint
            await self._publish_for(
                job,
                events.JobCheckpointed(
                    user=user,
                    job_id=report.job_id,
                    node_id=self.node_id,
                    attempt=report.attempt,
                    step=checkpoint.step,
                    path=str(checkpoint.path.absolute()),
                ),
                key=f"{self.node_id}/checkpoint/{checkpoint.path}",
            )
        else:
            await self._relay_exit(user, job, report)

    async def _relay_exit(
        self, user: str, job: LocalJob | None, report: lifecycle.JobExited
    ) -> None:
        self._xids.add(self._gpus.poll_xid_errors())
        if job is not None and report.checkpoint is not None:
            job.checkpoint_step = report.checkpoint.step
        asked = job is not None and (
            (job.stop is StopKind.YIELD and report.yielded)
            or (job.stop is StopKind.KILL and report.terminated_by is not None)
        )
        try:
            if asked:
                return
            if job is not None and report.yielded:
                # Yielded without a command of ours: the supervisor's own shutdown asked (a
                # drain that did not get to it first). Never let a yield read as an exit 0.
                asked = True
                drained = self._suspended(job, SuspendReason.DRAIN, None)
                await self._publish_for(
                    job, drained, key=f"{self.node_id}/yield/{job.started_at!r}"
                )
                return
            gpus = job.gpu_indices if job is not None else ()
            started = job.started_at if job is not None else report.time - report.duration_s
            await self._publish_for(
                job,
                events.JobExited(
                    user=user,
                    job_id=report.job_id,
                    node_id=self.node_id,
                    attempt=report.attempt,
                    exit_code=report.exit_code,
                    signal=report.signal,
                    runtime_s=max(report.duration_s, 0.0),
                    stderr_tail=report.stderr_tail[-MAX_STDERR_TAIL_CHARS:],
                    xid_errors=self._xids.during(gpus, started, report.time),
                ),
                key=f"{self.node_id}/exit/{user}/{report.job_id}/{report.attempt}/{started!r}",
            )
            _log.info(
                "job exited",
                job=f"{user}/{report.job_id}",
                exit_code=report.exit_code,
                signal=report.signal,
                completed=report.completed,
            )
        finally:
            if job is not None:
                job.status = RunStatus.STOPPED if asked else RunStatus.EXITED
                job.exit_handled.set()

    # ----- publishing --------------------------------------------------------------------

    async def _publish_for(
        self, job: LocalJob | None, data: EventData, *, key: str | None = None
    ) -> None:
        if job is None:
            await self._publish(data, key=key)
            return
        token = otel_context.attach(job.trace_context)
        try:
            await self._publish(data, key=key, correlation_id=job.correlation_id)
        finally:
            otel_context.detach(token)

    async def _publish(
        self,
        data: EventData,
        *,
        cause: Envelope | None = None,
        key: str | None = None,
        correlation_id: str | None = None,
    ) -> None:
        async with self._publish_lock:
            await self._send(data, cause=cause, key=key, correlation_id=correlation_id)

    async def _send(
        self,
        data: EventData,
        *,
        cause: Envelope | None = None,
        key: str | None = None,
        correlation_id: str | None = None,
    ) -> None:
        """Publish now (the caller holds the publish lock) under a stable id when it has one."""
        if self._runtime is None:
            raise RuntimeError("the node executor has not started")
        subject = data.subject()
        origin = cause.id if cause is not None else key
        # One event per (type, subject) per cause: the position needs no counting.
        event_id = derived_event_id(origin, 0, data.EVENT_TYPE, subject) if origin else None
        if cause is not None:
            correlation_id = cause.correlation_id or cause.id
        await self._runtime.publisher.publish(
            data, event_id=event_id, causation=cause, correlation_id=correlation_id
        )

    def _start_event(self, job: LocalJob, took_s: float) -> events.JobStarted | events.JobResumed:
        common = {
            "user": job.job.user,
            "job_id": job.job.job_id,
            "node_id": self.node_id,
            "gpu_indices": job.gpu_indices,
            "attempt": job.attempt,
        }
        if job.resumed_from is None:
            return events.JobStarted(**common)
        return events.JobResumed(**common, checkpoint_step=job.resumed_from, duration_s=took_s)

    def _suspended(
        self, job: LocalJob, reason: SuspendReason, result: lifecycle.SuspendResult | None
    ) -> events.JobSuspended:
        """`result` of the suspend that stopped it; None to restate what the run left."""
        step = job.checkpoint_step
        if result is not None:
            step = result.checkpoint.step if result.checkpoint else None
        return events.JobSuspended(
            user=job.job.user,
            job_id=job.job.job_id,
            node_id=self.node_id,
            attempt=job.attempt,
            reason=reason,
            checkpoint_step=step,
            duration_s=result.switch_s if result is not None else None,
        )

    # ----- timers ------------------------------------------------------------------------

    async def heartbeat(self) -> Sequence[Emit]:
        seq = self._heartbeat_seq
        self._heartbeat_seq += 1
        running = tuple(job.job for job in self.running())
        return [Emit(NodeHeartbeat(node_id=self.node_id, seq=seq, running=running))]

    async def telemetry(self) -> Sequence[Emit]:
        busy = frozenset(i for job in self.running() for i in job.gpu_indices)
        samples, xids = await anyio.to_thread.run_sync(self._read_gpus, busy)
        self._xids.add(xids)
        gpus = telemetry_samples(samples, self._xids.take_unreported(self._inventory))
        if not gpus:
            return []
        return [Emit(NodeTelemetry(node_id=self.node_id, gpus=gpus))]

    def _read_gpus(self, busy: frozenset[int]) -> tuple[list[GpuSample], list[XidError]]:
        return self._gpus.sample(busy), self._gpus.poll_xid_errors()


class _Superseded(Exception):
    """A command about an attempt this node has already moved past."""


__all__ = ["CANNOT_START_EXIT_CODE", "SERVICE_NAME", "NodeExecutor"]
