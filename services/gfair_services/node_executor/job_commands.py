"""What each command for this node means, given what runs here.

- start: launch the run; a repeat of a start already in effect is a no-op (its redelivery
  re-announces it); the same job on other GPUs is suspended and moved; a newer attempt replaces
  an older run; another job still holding the GPUs is suspended first (commands come in order,
  so the newest word on those GPUs is this start). Starts older than `command_max_age_s`, and
  starts of an attempt whose process ended on its own here, starts issued before a stop of the
  job this node already received (a redelivery: the scheduler's commands for a node are issued
  in order), and starts carried out past their `valid_until` (the scheduler may have forgotten
  them and run the job elsewhere), are stale: sent before an outage of this executor or before
  the scheduler heard of the exit, they would run it twice. A start is judged by itself alone:
  a job that ended or was retried since has its kill queued behind it.
- resume: a start with the command line of the job's last start here.
- prepare: launch the job's process without GPUs (a prepared start); it parks in the SDK and is
  reported parked in place, and the next start of the same attempt here resumes it in place on
  whatever GPUs the start names (a start that arrives while it still imports waits for its park
  as long as a resume may take, `resume_timeout_s`, then kills it and starts anew). Ignored
  when the job already has a live process here. A suspend,
  migrate or drain lets it go (it exits, or is killed before it parked: nothing to save).
- suspend / migrate: checkpoint and stop, then report `suspended` / `migrated`.
- kill: stop without a checkpoint; nothing is reported (whoever asked decided what follows).

Commands run concurrently where they touch neither the same job nor the same GPUs (`lanes`):
the suspends of a quantum together, then each start once the suspends of its GPUs are done.
A command about an attempt older than the run here is ignored. A suspend or migrate of a job
with nothing running here (stopped before, by an earlier executor of this node too, or never
started here) is answered as done: every stop gets its answer. A kill of a job not running here,
and a stop of one that ended here (its exit was reported), change nothing. A resume of a job
never started here and starts that cannot be carried out (GPUs this node lacks, a mix of
generations, a checkpoint directory outside this node's root) are dead-lettered with the reason:
they are scheduler or configuration bugs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from datetime import datetime
from pathlib import Path

import structlog

from gfair.bus.service import Unprocessable
from gfair.events import jobs as events
from gfair.events.commands import (
    KillCommand,
    MigrateCommand,
    NodeCommand,
    PrepareCommand,
    ResumeCommand,
    StartCommand,
    SuspendCommand,
)
from gfair.events.envelope import Envelope
from gfair.events.fields import JobRef
from gfair.events.reasons import SuspendReason
from gfair.node.gpu import GpuDevice
from gfair_services.node_executor.event_sink import EventSink, count_migration, count_suspend
from gfair_services.node_executor.local_job import LocalJob, RunStatus, RunTable
from gfair_services.node_executor.run_control import RunControl
from gfair_services.node_executor.settings import NodeExecutorSettings

_log = structlog.get_logger("gfair.services.node_executor")

# Set for the parts of a gang across servers only (gang_peers.py).
_GANG_ENV = "NNODES"

# Past this many remembered stops, the ones older than `command_max_age_s` are let go (a
# node's lifetime of jobs would otherwise pile up).
_STOPS_KEPT = 4096

Command = (
    StartCommand | PrepareCommand | SuspendCommand | ResumeCommand | MigrateCommand | KillCommand
)


class _Superseded(Exception):
    """A command about an attempt this node has already moved past."""


class JobCommands:
    def __init__(
        self,
        settings: NodeExecutorSettings,
        inventory: Mapping[int, GpuDevice],
        runs: RunTable,
        sink: EventSink,
        control: RunControl,
        clock: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._node_id = settings.node_id
        self._inventory = inventory
        self._runs = runs
        self._sink = sink
        self._control = control
        self._clock = clock
        # The newest stop (suspend, migrate, kill) of each job sent to this node: its attempt
        # and when it was issued. One older than `command_max_age_s` can only overtake starts
        # older still, which `_stale` drops anyway: `_forget_old_stops` lets those go.
        self._stopped: dict[JobRef, tuple[int, datetime]] = {}
        # The GPUs of each start not yet carried out, by job: a stop sent after it frees them.
        self._claims: dict[JobRef, tuple[int, ...]] = {}

    def lanes(self, envelope: Envelope, command: Command) -> list[Hashable]:
        """What the command waits for (`gfair.bus.service.Route.lanes`): the earlier commands
        of its job, and of the GPUs it takes or frees (the job's run here, a start of it not
        yet carried out, the start's own). So a start waits for the suspend of whatever held
        its GPUs, and runs beside the suspends and starts of other GPUs."""
        gpus = set(self._claims.get(command.job, ()))
        run = self._runs.get(command.job)
        if run is not None:
            gpus.update(run.gpu_indices)
        if isinstance(command, StartCommand | ResumeCommand):
            gpus.update(command.gpu_indices)
            self._claims[command.job] = tuple(command.gpu_indices)
        return [command.job, *(("gpu", index) for index in sorted(gpus))]

    async def handle(self, envelope: Envelope, command: Command) -> None:
        try:
            with self._control.commanding(command.job):
                await self._handle(envelope, command)
        finally:
            if isinstance(command, StartCommand | ResumeCommand) and self._claims.get(
                command.job
            ) == tuple(command.gpu_indices):
                del self._claims[command.job]

    async def _handle(self, envelope: Envelope, command: Command) -> None:
        if isinstance(command, StartCommand | ResumeCommand | PrepareCommand):
            if self._stale(envelope) or self._overtaken(envelope, command):
                return
        else:
            stop = (command.attempt, envelope.time)
            self._stopped[command.job] = max(self._stopped.get(command.job, stop), stop)
            if len(self._stopped) > _STOPS_KEPT:
                self._forget_old_stops()
        try:
            if isinstance(command, StartCommand):
                await self._start(envelope, command)
            elif isinstance(command, ResumeCommand):
                await self._resume(envelope, command)
            elif isinstance(command, PrepareCommand):
                await self._prepare(envelope, command)
            elif isinstance(command, SuspendCommand):
                await self._suspend(envelope, command)
            elif isinstance(command, MigrateCommand):
                await self._migrate(envelope, command)
            else:
                await self._kill(command)
        except _Superseded:
            return

    def generation_of(self, gpu_indices: tuple[int, ...]) -> str:
        """The one generation of these GPUs of this node; `Unprocessable` otherwise."""
        missing = sorted(set(gpu_indices) - set(self._inventory))
        if missing:
            raise Unprocessable(
                f"node {self._node_id} has no GPU {missing} (it has {sorted(self._inventory)})"
            )
        generations = {self._inventory[i].generation for i in gpu_indices}
        if len(generations) != 1:
            raise Unprocessable(
                f"GPUs {list(gpu_indices)} of node {self._node_id} mix generations "
                f"{sorted(generations)}: a gang runs on one generation"
            )
        return generations.pop()

    def _check_checkpoint_dir(self, command: StartCommand | PrepareCommand) -> None:
        """`Unprocessable` unless the job's checkpoints are where this node keeps them."""
        expected = self._settings.checkpoint_dir(command.user, command.job_id)
        if Path(command.checkpoint_dir) != expected:
            raise Unprocessable(
                f"checkpoint dir {command.checkpoint_dir} is not {expected}: the scheduler's "
                f"checkpoint root differs from node {self._node_id}'s "
                f"({self._settings.checkpoint_root})"
            )

    def _stale(self, envelope: Envelope) -> bool:
        age = self._clock() - envelope.time.timestamp()
        if age <= self._settings.command_max_age_s:
            return False
        _log.warning("stale start ignored", event_id=envelope.id, age_s=round(age, 1))
        return True

    def _expired(self, command: StartCommand | PrepareCommand) -> bool:
        """Whether the start is carried out past its `valid_until`, by this node's clock."""
        until = command.valid_until if isinstance(command, StartCommand) else None
        if until is None or self._clock() <= until.timestamp():
            return False
        _log.warning(
            "start past its valid_until ignored",
            job=str(command.job),
            attempt=command.attempt,
            late_s=round(self._clock() - until.timestamp(), 1),
        )
        return True

    def _forget_old_stops(self) -> None:
        oldest = self._clock() - self._settings.command_max_age_s
        self._stopped = {
            job: stop for job, stop in self._stopped.items() if stop[1].timestamp() >= oldest
        }

    def _overtaken(
        self, envelope: Envelope, command: StartCommand | ResumeCommand | PrepareCommand
    ) -> bool:
        """Whether the scheduler stopped the job here after it sent this start: the start is
        a redelivery (a broker failover, a lost ack) of one that has had its time. A newer
        attempt is never one (and may come from another service's clock)."""
        stopped = self._stopped.get(command.job)
        if stopped is None or (command.attempt, envelope.time) >= stopped:
            return False
        _log.warning(
            "start sent before a later stop ignored",
            job=str(command.job),
            event_id=envelope.id,
            attempt=command.attempt,
        )
        return True

    def _current(self, command: NodeCommand) -> LocalJob | None:
        """This node's run of the job; `_Superseded` if the command is about an earlier attempt."""
        run = self._runs.get(command.job)
        if run is not None and command.attempt < run.attempt:
            _log.info(
                "command for an earlier attempt ignored",
                job=str(command.job),
                command=command.command_name(),
                attempt=command.attempt,
                current=run.attempt,
            )
            raise _Superseded
        return run

    async def _start(self, envelope: Envelope, command: StartCommand) -> None:
        current = self._current(command)
        if (
            current is not None
            and current.status is RunStatus.EXITED
            and command.attempt == current.attempt
        ):
            # It ended on its own here: that attempt is over (a retry is a newer attempt).
            # The start was sent before the scheduler heard of the exit, and the job's
            # record may trail too (after a broker outage): relaunching would run it twice.
            _log.warning(
                "start of an attempt that ended here ignored",
                job=str(command.job),
                attempt=command.attempt,
            )
            return
        if current is not None and current.preparing is not None:
            await self._control.until_prepared(current)  # parked, or gone
        if current is not None and current.parked and await self._control.still_running(current):
            indices = tuple(command.gpu_indices)
            if self._may_resume_on(current, indices) and command.attempt == current.attempt:
                if self._expired(command):
                    return
                await self._free(envelope, command)
                resumed = await self._control.resume_in_place(
                    envelope, current, command.attempt, indices
                )
                if resumed:
                    return
            # Elsewhere on this node (CUDA_VISIBLE_DEVICES is fixed per process), a newer
            # attempt, or it would not resume: it checkpoints and exits; a new process starts.
            if command.attempt > current.attempt:
                await self._control.kill_run(current, f"superseded by attempt {command.attempt}")
            else:
                await self._control.yield_run(current, current.stop_event_id)
                current.told()  # (its park was reported; the start speaks for it from here)
        if current is not None and current.running and await self._control.still_running(current):
            same = sorted(current.gpu_indices) == sorted(command.gpu_indices)
            if same and command.attempt == current.attempt:
                if envelope.id == current.start_event_id:  # redelivered: announce again
                    started = self._control.start_event(current, 0.0)
                    await self._sink.publish(started, cause=envelope)
                return
            if command.attempt > current.attempt:
                await self._control.kill_run(current, f"superseded by attempt {command.attempt}")
            else:
                await self._suspend_run(envelope, current, SuspendReason.TIME_SLICE)
        if self._expired(command):
            return
        generation = self.generation_of(tuple(command.gpu_indices))
        self._check_checkpoint_dir(command)
        await self._free(envelope, command)
        await self._control.launch(envelope, command, generation)

    async def _free(self, envelope: Envelope, command: StartCommand) -> None:
        """Suspend another job still on the GPUs `command` takes: a start sent before a later
        one on the same GPUs can arrive after it (redelivered, or delayed by a broker failover),
        and two jobs on one GPU is never right, whether the start is cold or in place."""
        wanted = set(command.gpu_indices)
        for occupant in self._runs.running():
            held = wanted & set(occupant.gpu_indices)
            if occupant.job != command.job and held:
                _log.warning(
                    "GPUs still held by another job: suspending it",
                    job=str(occupant.job),
                    gpus=sorted(held),
                )
                await self._suspend_run(envelope, occupant, SuspendReason.TIME_SLICE)

    async def _prepare(self, envelope: Envelope, command: PrepareCommand) -> None:
        current = self._current(command)
        if current is not None and (
            current.alive
            or (current.status is RunStatus.EXITED and current.attempt == command.attempt)
        ):
            _log.info("prepare of a job with a process here ignored", job=str(command.job))
            return
        if self._expired(command):
            return
        generation = command.generation
        if not any(gpu.generation == generation for gpu in self._inventory.values()):
            raise Unprocessable(f"node {self._node_id} has no {generation} GPUs")
        self._check_checkpoint_dir(command)
        await self._control.prepare(envelope, command, generation)

    async def _resume(self, envelope: Envelope, command: ResumeCommand) -> None:
        last = self._control.launches.load(command.job)
        if last is None:
            raise Unprocessable(
                f"node {self._node_id} never started {command.job}: a resume needs the job's "
                "command line from an earlier start here; send a start command instead"
            )
        # (A resume stands as long as its own command: not its start's `valid_until`.)
        start = last.model_copy(
            update={
                "gpu_indices": command.gpu_indices,
                "attempt": command.attempt,
                "valid_until": None,
            }
        )
        await self._start(envelope, start)

    async def _suspend(self, envelope: Envelope, command: SuspendCommand) -> None:
        run = self._current(command)
        if run is not None and run.stop_event_id == envelope.id and not run.running:
            # Redelivered after it took effect: announce again, under the same id.
            restated = run.suspended(self._node_id, command.reason, None)
            await self._sink.publish(restated, cause=envelope)
            return
        if run is not None and run.status is RunStatus.PREPARING:
            # Not parked yet: nothing of it is worth keeping.
            await self._control.kill_run(run, "let go before it was given GPUs")
            await self._sink.publish(
                run.suspended(self._node_id, command.reason, None), cause=envelope
            )
            run.told()
            return
        if run is not None and run.parked:
            # Parked here, and wanted elsewhere (the scheduler moves it): it checkpoints and
            # exits, so the node it starts on takes its newest state along.
            await self._suspend_run(envelope, run, command.reason, None)
            return
        if run is None or run.status is RunStatus.STOPPED:
            # Nothing of it runs here (it was stopped before, by an earlier executor of this
            # node too, or never started here): said so, as a stop that took effect. A stop
            # left unanswered keeps the job from running anywhere until the scheduler gives up
            # on it (`release_timeout_s`).
            await self._sink.publish(self._not_here(command, run), cause=envelope)
            return
        if not run.running:
            _log.info("suspend of a job that ended here ignored", job=str(command.job))
            return
        await self._suspend_run(envelope, run, command.reason, command.yield_grace_s)

    def _not_here(self, command: SuspendCommand, run: LocalJob | None) -> events.JobSuspended:
        if run is not None:
            return run.suspended(self._node_id, command.reason, None)
        return events.JobSuspended(
            user=command.user,
            job_id=command.job_id,
            node_id=self._node_id,
            attempt=command.attempt,
            reason=command.reason,
        )

    async def _suspend_run(
        self,
        envelope: Envelope,
        run: LocalJob,
        reason: SuspendReason,
        grace_s: float | None = None,
    ) -> None:
        # Only a time slice parks: a move, a drain or a failure policy's stop is for good here.
        # A gang's parts cannot resume in place one node at a time: they checkpoint together.
        park = reason is SuspendReason.TIME_SLICE and not self._gang(run)
        result = await self._control.yield_run(run, envelope.id, grace_s, park=park)
        if result is not None:
            await self._sink.publish(run.suspended(self._node_id, reason, result), cause=envelope)
            count_suspend(self._node_id, reason)
            if not result.parked:
                run.told()
            else:
                # After the report: reading the parked processes' memory takes a round trip
                # to each tenant's supervisor, and the scheduler waits for the GPUs.
                await self._control.within_parked_memory(run.job)

    async def _migrate(self, envelope: Envelope, command: MigrateCommand) -> None:
        run = self._current(command)
        if run is not None and run.status is RunStatus.EXITED:
            _log.info("migrate of a job that ended here ignored", job=str(command.job))
            return
        if run is not None and run.alive:
            result = await self._control.yield_run(run, envelope.id)
            if result is None:
                return  # it ended on its own meanwhile; its exit was reported
            run.checkpoint_step = result.checkpoint.step if result.checkpoint else None
        # A job already suspended here, or not here at all, needs nothing but the announcement:
        # its checkpoint is in the shared directory the target node reads.
        migrated = events.JobMigrated(
            user=command.user,
            job_id=command.job_id,
            from_node=self._node_id,
            to_node=command.to_node,
            reason=command.reason,
            attempt=command.attempt if run is None else run.attempt,
            checkpoint_step=None if run is None else run.checkpoint_step,
        )
        await self._sink.publish(migrated, cause=envelope)
        if run is not None:
            run.told()
        # A redelivered migrate announces again and counts again: metrics are not the record.
        count_migration(self._node_id, command.reason)

    def _may_resume_on(self, run: LocalJob, gpu_indices: tuple[int, ...]) -> bool:
        """Whether the parked `run` may continue in its process on `gpu_indices`: its own GPUs;
        a prepared start, bound to none yet, any of its generation; or, where they are
        simulated (nothing binds a process to a device: its "GPU" is the CPU), any of this
        node's, as many as it had."""
        if sorted(run.gpu_indices) == sorted(gpu_indices):
            return True
        if not run.gpu_indices:
            return bool(gpu_indices) and self.generation_of(gpu_indices) == run.generation
        simulated = all(
            i in self._inventory and self._inventory[i].simulated
            for i in (*run.gpu_indices, *gpu_indices)
        )
        return simulated and len(run.gpu_indices) == len(gpu_indices)

    def _gang(self, run: LocalJob) -> bool:
        last = self._control.launches.load(run.job)
        return last is not None and _GANG_ENV in last.env

    async def _kill(self, command: KillCommand) -> None:
        run = self._current(command)
        if run is None or not run.alive:
            _log.info("kill of a job not running here ignored", job=str(command.job))
            return
        if command.started_before is not None and (
            run.started_at >= command.started_before.timestamp()
        ):
            _log.info(
                "kill of a run newer than its sender knew ignored",
                job=str(command.job),
                reason=command.reason,
            )
            return
        await self._control.kill_run(run, command.reason)
