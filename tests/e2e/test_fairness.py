"""Fair share on a real, saturated cluster: GPU time follows tickets (docs/design.md §1.1)."""

from __future__ import annotations

import asyncio

import pytest

from gfair.client import GfairClient
from gfair.state.stride_record import StrideRecord
from support.waiting import eventually

from .conftest import RESNET, StartCluster, client_of, synthetic

pytestmark = [pytest.mark.nats, pytest.mark.slow]

TICKETS = {"alice": 2.0, "bob": 1.0, "carol": 1.0}
WINDOW_S = 14.0


async def every_user_ran(client: GfairClient) -> dict[str, float] | None:
    """Each user's usage, once every one has had GPU time (no ledger before the first quantum)."""
    if await client.stride() is None:
        return None
    used = await usage(client)
    return used if all(used.values()) else None


async def usage(client: GfairClient) -> dict[str, float]:
    record: StrideRecord | None = await client.stride()
    assert record is not None
    return {user: record.usage_of(user) for user in TICKETS}


async def test_three_users_with_tickets_2_1_1_share_a_saturated_cluster_50_25_25(
    start_cluster: StartCluster,
) -> None:
    async with (
        start_cluster(cluster="v100:2x2", quantum_s=1.0, user_tickets=TICKETS) as cluster,
        client_of(cluster) as client,
    ):
        # 12 one-GPU jobs on 4 GPUs, each far longer than the window; submitted in turns.
        for n in range(4):
            for user in TICKETS:
                await client.submit(
                    user,
                    1,
                    synthetic(duration_s=3000, speed_scale=10),
                    job_type=RESNET,
                    job_id=f"{user}-{n}",
                )
        # Every user has had GPU time: the jobs are placed and the first quanta past.
        before = await eventually(lambda: every_user_ran(client), 60)
        await asyncio.sleep(WINDOW_S)  # pause under test: the window the shares are measured in
        after = await usage(client)
        users = await client.users()
    received = {user: after[user] - before[user] for user in TICKETS}
    total = sum(received.values())
    # Four GPUs held the whole window, give or take a quantum at either end.
    assert total == pytest.approx(4 * WINDOW_S, rel=0.2)
    shares = {user: received[user] / total for user in TICKETS}
    assert shares["alice"] == pytest.approx(0.50, abs=0.08), shares
    assert shares["bob"] == pytest.approx(0.25, abs=0.06), shares
    assert shares["carol"] == pytest.approx(0.25, abs=0.06), shares
    # What `gfair users` shows agrees with the ledger it reads.
    assert {u.user for u in users.users} >= set(TICKETS)
