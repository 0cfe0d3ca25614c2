"""A last look at the job's record (`gfair_jobs`, placement's) before a start takes effect.

Commands wait in this node's durable consumer while the executor is down; when it comes back
it reads them in order. By then a job may have ended, been retried (a newer attempt), or been
placed on other servers by a later quantum, and such a start would run it a second time. The
record says so; a job without a record (placement has not written it, or runs without one in
tests) is let through, the scheduler's command being the best knowledge there is.

The record's placement trails split-stride's (placement records each `JobPlaced` as it reads it,
while the start that follows a placement may reach the node first), so only a placement the
record took at or after the command was issued makes a start outdated.
"""

from __future__ import annotations

from datetime import datetime

import structlog

from gfair.bus.key_value import KeyValue
from gfair.events.commands import PrepareCommand, StartCommand
from gfair.state.job_record import load_job

_log = structlog.get_logger("gfair.services.node_executor")


class StartGuard:
    def __init__(self, node_id: str) -> None:
        self._node_id = node_id
        self._jobs: KeyValue | None = None

    def bind(self, jobs: KeyValue) -> None:
        self._jobs = jobs

    async def outdated(
        self, command: StartCommand | PrepareCommand, issued_at: datetime
    ) -> str | None:
        """Why the start (sent at `issued_at`) no longer stands, or None when it does."""
        if self._jobs is None:
            return None
        stored = await load_job(self._jobs, command.user, command.job_id)
        if stored is None:
            return None
        record = stored.record
        reason = None
        if record.state.terminal:
            reason = f"the job is {record.state.value}"
        elif record.attempt > command.attempt:
            reason = f"the job is on attempt {record.attempt}"
        elif record.servers and self._node_id not in record.servers:
            placed_at = max((d.at for d in record.decisions if d.kind == "placement"), default=None)
            if placed_at is not None and placed_at >= issued_at:
                reason = f"the job was placed on {', '.join(record.servers)} since"
        if reason is not None:
            _log.warning(
                "outdated start ignored",
                job=str(command.job),
                attempt=command.attempt,
                reason=reason,
            )
        return reason
