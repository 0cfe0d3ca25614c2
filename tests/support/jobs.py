"""Waiting on a job through the client, for the tests that run a cluster."""

from __future__ import annotations

from gfair.client import GfairClient, JobDetails
from support.waiting import eventually


async def settled(
    client: GfairClient, user: str, job_id: str, timeout_s: float = 10.0, interval_s: float = 0.05
) -> JobDetails:
    """The job's details once placement's record caught up with its terminal event."""

    async def ended() -> JobDetails | None:
        details = await client.job(user, job_id)
        return details if details.record is not None and details.record.state.terminal else None

    return await eventually(
        ended, timeout_s, interval_s, what=f"the record of {user}/{job_id} reaching its end"
    )
