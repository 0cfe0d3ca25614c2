"""What the job supervisors report, relayed as job events.

Progress (with the run's GPU generation, once a rate is known), checkpoints, and the end of a
run. An end the scheduler did not ask for is `exited`, with the stderr tail and the XID errors
seen on the run's GPUs, for the failure detector to classify; an end it asked for (a yield, a
kill) is left to the command that asked, which reports it once the relay has seen it.
"""

from __future__ import annotations

import time

import structlog

from gfair.events import jobs as events
from gfair.events.fields import MAX_STDERR_TAIL_CHARS, JobRef
from gfair.events.reasons import SuspendReason
from gfair.node import lifecycle
from gfair.node.gpu import GpuBackend
from gfair_services.node_executor.event_sink import EventSink, count_suspend
from gfair_services.node_executor.gpu_report import XidLog
from gfair_services.node_executor.local_job import LocalJob, RunStatus, RunTable, StopKind

_log = structlog.get_logger("gfair.services.node_executor")


# The longest a running job goes without a progress report while its node is busy: well
# within what the failure detector takes for a hang (GFAIR_HANG_AFTER_S, 600 s).
PROGRESS_HELD_AT_MOST_S = 30.0
# A progress report this long in coming to the relay found it behind.
PROGRESS_LATE_S = 1.0


def _overdue(run: LocalJob, now: float) -> bool:
    """Whether `run`'s next progress report must go out, busy or not: its first one (it says
    how long the job took to its first mini-batch), or one long after the last."""
    sent = run.progress_sent_at
    return sent is None or now - sent >= PROGRESS_HELD_AT_MOST_S


class ReportRelay:
    def __init__(
        self, node_id: str, runs: RunTable, sink: EventSink, gpus: GpuBackend, xids: XidLog
    ) -> None:
        self._node_id = node_id
        self._runs = runs
        self._sink = sink
        self._gpus = gpus
        self._xids = xids

    async def __call__(self, user: str, report: lifecycle.JobEvent) -> None:
        run = self._runs.get(JobRef(user=user, job_id=report.job_id))
        if isinstance(report, lifecycle.ProgressReport):
            await self._progress(user, run, report)
        elif isinstance(report, lifecycle.CheckpointReport):
            await self._checkpointed(user, run, report)
        else:
            await self._exited(user, run, report)

    async def _progress(
        self, user: str, run: LocalJob | None, report: lifecycle.ProgressReport
    ) -> None:
        if run is None or not run.running or report.rate_per_s is None:
            return  # no rate yet (two reports make one), or a run already over
        now = time.monotonic()
        behind = time.time() - report.time > PROGRESS_LATE_S or self._sink.busy
        if behind and not _overdue(run, now):
            # Each publish waits for the broker's acknowledgement and the relay's reports go
            # out one at a time: reports queued behind each other would hold up the
            # checkpoints, exits and commands' events behind them by seconds
            # (eight jobs a node reporting every second, at a hundred servers). A report only
            # supersedes the last one: one that comes late, or while the node is busy
            # publishing, is let go, and a later one carries its steps.
            return
        run.progress_sent_at = now
        first_step_s = None
        if not run.first_step_reported and report.first_step_at and run.commanded_at:
            first_step_s = max(0.0, report.first_step_at - run.commanded_at)
            run.first_step_reported = True
        await self._sink.publish_for(
            run,
            events.JobProgress(
                user=user,
                job_id=report.job_id,
                node_id=self._node_id,
                generation=run.generation,
                attempt=report.attempt,
                minibatches_per_s=report.rate_per_s,
                iterations=report.steps,
                checkpoint_step=report.checkpoint_step,
                window_s=report.window_s or None,
                first_step_s=first_step_s,
            ),
            # Several a slice per running job: a span each would be most of a long job's trace.
            traced=False,
        )

    async def _checkpointed(
        self, user: str, run: LocalJob | None, report: lifecycle.CheckpointReport
    ) -> None:
        checkpoint = report.checkpoint
        if run is not None:
            run.checkpoint_step = checkpoint.step
        await self._sink.publish_for(
            run,
            events.JobCheckpointed(
                user=user,
                job_id=report.job_id,
                node_id=self._node_id,
                attempt=report.attempt,
                step=checkpoint.step,
                path=str(checkpoint.path.absolute()),
            ),
            key=f"{self._node_id}/checkpoint/{checkpoint.path}",
        )

    async def _exited(self, user: str, run: LocalJob | None, report: lifecycle.ExitReport) -> None:
        # The XID that killed a job is usually raised as it dies: look now, not at the next
        # telemetry sample.
        self._xids.add(self._gpus.poll_xid_errors())
        if run is not None and report.checkpoint is not None:
            run.checkpoint_step = report.checkpoint.step
        asked = run is not None and (
            (run.stop is StopKind.YIELD and report.yielded)
            or (run.stop is StopKind.KILL and report.terminated_by is not None)
        )
        if run is not None:
            # Its process is gone: the run holds nothing from here on, before anyone hears of it.
            run.status = RunStatus.STOPPED if asked or report.yielded else RunStatus.EXITED
        try:
            if asked:
                return
            if run is not None and report.yielded:
                # Yielded with no command of ours: the supervisor's own shutdown asked (a drain
                # that did not get to it first). A yield must never read as an exit 0.
                drained = run.suspended(self._node_id, SuspendReason.DRAIN, None)
                key = f"{self._node_id}/yield/{run.job}/{run.started_at!r}"
                await self._sink.publish_for(run, drained, key=key)
                run.told()
                count_suspend(self._node_id, SuspendReason.DRAIN)
                return
            await self._report_exit(user, run, report)
            if run is not None:
                run.told()
        finally:
            if run is not None:
                run.end_span(report)
                run.exit_handled.set()

    async def _report_exit(
        self, user: str, run: LocalJob | None, report: lifecycle.ExitReport
    ) -> None:
        gpus = run.gpu_indices if run is not None else ()
        started = run.started_at if run is not None else report.time - report.duration_s
        await self._sink.publish_for(
            run,
            events.JobExited(
                user=user,
                job_id=report.job_id,
                node_id=self._node_id,
                attempt=report.attempt,
                exit_code=report.exit_code,
                signal=report.signal,
                runtime_s=max(report.duration_s, 0.0),
                stderr_tail=report.stderr_tail[-MAX_STDERR_TAIL_CHARS:],
                xid_errors=self._xids.during(gpus, started, report.time),
            ),
            key=f"{self._node_id}/exit/{user}/{report.job_id}/{report.attempt}/{started!r}",
        )
        _log.info(
            "job exited",
            job=f"{user}/{report.job_id}",
            exit_code=report.exit_code,
            signal=report.signal,
            completed=report.completed,
        )
