"""How long the records of ended jobs are kept (`RetentionSettings`, a service `Settings` mixin),
and purging them (`EndedJobs`).

Placement keeps a record per job in `gfair_jobs`, the failure detector one in `gfair_failures`;
each purges the records of jobs that ended more than ``GFAIR_JOB_RETENTION_S`` ago, so neither
bucket grows with the cluster's age. The jobs' events stay in `GFAIR_JOBS` for its own age limit.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import structlog
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gfair.bus.key_value import KeyValue
from gfair.bus.transport import BusError

_log = structlog.get_logger("gfair.retention")


class RetentionSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

    job_retention_s: float = Field(
        default=30 * 24 * 3600.0,
        gt=0,
        description="How long the record of an ended job (completed, failed, cancelled or "
        "rejected) is kept; then it is purged",
    )
    retention_check_s: float = Field(
        default=3600.0, gt=0, description="How often records past their retention are purged"
    )

    def retention_cutoff(self, now: datetime) -> datetime:
        """Records of jobs that ended before this are purged."""
        return now - timedelta(seconds=self.job_retention_s)


class EndedJobs:
    """When each ended job whose record is still kept ended."""

    def __init__(self) -> None:
        self._at: dict[str, datetime] = {}

    def note(self, key: str, at: datetime) -> None:
        self._at[key] = at

    def before(self, cutoff: datetime) -> list[str]:
        """The jobs that ended before `cutoff`, oldest first."""
        return sorted((k for k, at in self._at.items() if at < cutoff), key=self._at.__getitem__)

    async def purge(self, kv: KeyValue, cutoff: datetime) -> list[str]:
        """Delete the records of the jobs that ended before `cutoff` from `kv`, oldest first,
        and forget them; stop at the first delete that fails (the next check goes on from
        there). The keys deleted."""
        purged: list[str] = []
        for key in self.before(cutoff):
            try:
                await kv.delete(key)
            except BusError as error:
                _log.warning("purging job records stopped", job=key, error=str(error))
                break
            del self._at[key]
            purged.append(key)
        if purged:
            _log.info("ended jobs' records purged", bucket=kv.bucket, count=len(purged))
        return purged
