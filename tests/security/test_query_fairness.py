"""Issue 23, hole 5: 300 questions at once from alice made bob's `gfair jobs` time out.

The query service had one queue for everybody. Now each tenant has its own, and tenants take
turns for the service's slots: bob's question, asked while alice's flood waits, is answered
before most of alice's, and alice's questions beyond her queue are refused at once with the
reason instead of waiting (or being dropped).
"""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client as NatsClient

from gfair.client.queries import ERROR_HEADER
from gfair_services.query import QuerySettings
from tenancy.conftest import Logins

from .query_service import answering, cluster_state, query_service

pytestmark = pytest.mark.nats

FLOOD = 300
# Small limits, so that the flood outlasts bob's question by many answers on any machine: a
# turn is a question of alice's or of bob's, and alice's are also held to her rate.
SETTINGS = QuerySettings(
    query_concurrency=2,
    query_tenant_concurrency=1,
    query_tenant_rate=40.0,
    query_tenant_burst=5,
    query_tenant_queue=60,
)


async def test_a_tenants_flood_does_not_hold_up_another_tenants_question(
    logins: Logins,
) -> None:
    await cluster_state(logins)
    async with query_service(logins, settings=SETTINGS):
        await answering(logins, "alice")
        await answering(logins, "bob")
        alice = await logins.connection("alice")
        bob = await logins.connection("bob")
        # Who got what, in the order the answers came.
        answers: list[tuple[str, str | None]] = []
        alice_answered = asyncio.Event()

        async def ask(who: str, nc: NatsClient, what: str) -> None:
            reply = await nc.request(f"gfair.query.{who}.{what}", b"{}", timeout=30)
            error = (reply.headers or {}).get(ERROR_HEADER)
            answers.append((who, error))
            if error is None:
                alice_answered.set()

        flood = [asyncio.create_task(ask("alice", alice.nc, "jobs")) for _ in range(FLOOD)]
        # Bob asks while the flood is in progress: after alice's first answers came.
        await asyncio.wait_for(alice_answered.wait(), 30)
        await ask("bob", bob.nc, "jobs")
        await asyncio.gather(*flood)

    bob_at = answers.index(("bob", None))  # answered, not refused
    alices = [error for who, error in answers if who == "alice"]
    answered = [error for error in alices if error is None]
    refused = [error for error in alices if error is not None]
    # Beyond her queue, alice is told at once to retry; the rest of her flood is answered.
    assert refused, "alice's questions beyond her queue are refused"
    assert all("too many questions in flight for alice; retry later" in e for e in refused)
    assert len(answered) + len(refused) == FLOOD
    # Bob's answer came before most of alice's: it took a turn, not a place behind the flood.
    answered_after_bob = sum(1 for who, error in answers[bob_at:] if who == "alice" and not error)
    assert answered_after_bob >= len(answered) // 2, (answered_after_bob, len(answered))
