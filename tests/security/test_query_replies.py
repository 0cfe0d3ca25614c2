"""Issue 23, hole 1: the query service answered on any reply subject, with the services' rights.

A tenant's question with reply subject ``$JS.API.STREAM.PURGE.KV_gfair_jobs`` emptied the job
records: the error answer's empty body is, to JetStream, a purge. Now a tenant's question comes
through its own account's import, so the broker maps any reply subject it names back into that
account, where no stream exists (issue 41); the service itself answers a question about ``<u>``
only on ``_INBOX_<u>.`` or such a mapped reply (tested here with the services' full rights and
a question from inside the services' account, so only that check stands in the way); and it
logs in as ``gfair-query``, whose permissions refuse a purge even if it tried (tested with that
login directly).
"""

from __future__ import annotations

import nats.errors
import pytest
import structlog
from nats.aio.msg import Msg
from nats.js.api import ConsumerInfo
from nats.js.client import JetStreamContext

from gfair.bus.nats_bus import NatsBus
from gfair.client.query_access import QueryAccess
from gfair.events.jobs import JobAccepted
from gfair.events.subjects import DLQ_STREAM, dlq_subject
from gfair.state import buckets
from gfair.state.job_record import load_job
from support.waiting import consistently
from tenancy.conftest import SERVICES_USER, Logins

from .query_service import QUERY_USER, answering, cluster_state, query_service

pytestmark = pytest.mark.nats

DURABLE = "placement-jobs"
NODE_DURABLE = "node-executor-sim-1"


async def durables(bus: NatsBus) -> NatsBus:
    """The durables a running cluster has, that a reply subject could delete."""
    js = bus.client.jetstream()
    await js.add_consumer("GFAIR_JOBS", durable_name=DURABLE, ack_policy="explicit")
    await js.add_consumer(
        "GFAIR_COMMANDS",
        durable_name=NODE_DURABLE,
        ack_policy="explicit",
        filter_subject="gfair.cmd.sim-1.*",
    )
    return bus


async def dead_letter(bus: NatsBus) -> None:
    await bus.publish(dlq_subject("GFAIR_JOBS"), b"{}", headers={}, msg_id="dlq-1")


async def state_of(bus: NatsBus) -> dict[str, object]:
    js = bus.client.jetstream()
    jobs = await load_job(await bus.key_value(buckets.JOBS.name), "alice", "a1")
    names = [c.name for s in ("GFAIR_JOBS", "GFAIR_COMMANDS") for c in await consumers(js, s)]
    return {
        "alice's job": jobs is not None,
        "dead letters": (await js.stream_info(DLQ_STREAM.name)).state.messages,
        "durables": sorted(names),
    }


async def consumers(js: JetStreamContext, stream: str) -> list[ConsumerInfo]:
    return await js.consumers_info(stream)


BAD_REPLIES = (
    "$JS.API.STREAM.PURGE.KV_gfair_jobs",
    "$JS.API.STREAM.PURGE.GFAIR_DLQ",
    "$JS.API.STREAM.DELETE.KV_gfair_jobs",
    f"$JS.API.CONSUMER.DELETE.GFAIR_JOBS.{DURABLE}",
    f"$JS.API.CONSUMER.DELETE.GFAIR_COMMANDS.{NODE_DURABLE}",
    "gfair.job.alice.x.completed",
    "_INBOX_bob.stolen",  # another tenant's inbox
    "_INBOX.shared",  # everybody's
    "_INBOX_alice",  # the prefix alone, no inbox under it
)


async def test_answers_go_only_to_the_askers_inbox_even_with_the_services_rights(
    logins: Logins,
) -> None:
    services = await durables(await cluster_state(logins))
    await dead_letter(services)
    before = await state_of(services)
    assert before == {"alice's job": True, "dead letters": 1, "durables": [NODE_DURABLE, DURABLE]}
    # Whatever reaches the bad reply subjects, seen with the services' rights.
    seen: list[Msg] = []

    async def watch(msg: Msg) -> None:
        seen.append(msg)

    watcher = await logins.bus(SERVICES_USER)
    for reply in BAD_REPLIES:
        await watcher.client.subscribe(reply, cb=watch)
    await watcher.client.flush()
    async with query_service(logins, user=SERVICES_USER):
        await answering(logins)
        alice = await logins.connection("alice")
        # The operator logs in to the services' account: its reply subjects are not remapped.
        operator = await logins.connection("operator")
        dropped_by_asker: dict[str, set[tuple[str, str]]] = {}
        for name, asker in (("alice", alice), ("operator", operator)):
            with structlog.testing.capture_logs() as logs:
                for reply in BAD_REPLIES:
                    # An error answer (an empty body) and a real one (the job's record).
                    for what, body in (
                        ("why", b'{"job_id": "nope"}'),
                        ("job", b'{"job_id": "a1"}'),
                    ):
                        await asker.nc.publish(f"gfair.query.alice.{what}", body, reply=reply)
                await asker.nc.flush()
                # Questions are taken in the order they came: once a later one is answered,
                # the bad ones were dealt with. The service is still up, and answers alice.
                answer = await alice.nc.request("gfair.query.alice.job", b'{"job_id": "a1"}', 5)
                assert b'"a1"' in answer.data
            dropped = [entry for entry in logs if entry["event"].startswith("question dropped")]
            assert all(e["log_level"] == "warning" and e["subject"] for e in dropped)
            dropped_by_asker[name] = {(e["tenant"], e["reply"]) for e in dropped}
        await watcher.client.flush()
        await consistently(lambda: seen == [], 0.2)
        assert await state_of(services) == before
        # Alice's replies were mapped into her own account, so the service answered them
        # there, harmlessly; the operator's were the service's own to refuse.
        assert dropped_by_asker == {
            "alice": set(),
            "operator": {("alice", reply) for reply in BAD_REPLIES},
        }


async def test_the_query_login_is_refused_a_purge_by_the_server(logins: Logins) -> None:
    """Defence in depth: were the service's check gone, its login could purge nothing."""
    services = await durables(await cluster_state(logins))
    await dead_letter(services)
    before = await state_of(services)
    query = await logins.connection(QUERY_USER)
    forbidden = (
        "$JS.API.STREAM.PURGE.KV_gfair_jobs",
        "$JS.API.STREAM.PURGE.GFAIR_DLQ",
        "$JS.API.STREAM.DELETE.GFAIR_JOBS",
        "$JS.API.STREAM.MSG.DELETE.KV_gfair_jobs",
        f"$JS.API.CONSUMER.DELETE.GFAIR_JOBS.{DURABLE}",
        f"$JS.API.CONSUMER.DELETE.GFAIR_COMMANDS.{NODE_DURABLE}",
        f"$JS.API.CONSUMER.MSG.NEXT.GFAIR_COMMANDS.{NODE_DURABLE}",
    )
    for subject in forbidden:
        with pytest.raises(nats.errors.TimeoutError):
            await query.nc.request(subject, b"", timeout=1)
        assert subject.lower() in (await query.refusal()).lower()
    for subject in ("gfair.job.alice.x.completed", "$KV.gfair_jobs.alice.a1", "_INBOX.shared"):
        await query.nc.publish(subject, b"")
        assert subject.lower() in (await query.refusal()).lower()
    assert await state_of(services) == before


async def test_under_its_own_login_the_service_answers_every_kind_of_question(
    logins: Logins,
) -> None:
    services = await cluster_state(logins)
    del services
    async with query_service(logins):
        await answering(logins)
        connection = await logins.connection("alice")
        alice = QueryAccess(connection.nc, "alice")
        with structlog.testing.capture_logs() as logs:
            assert [r.job_id for r in await alice.job_records("alice")] == ["a1"]
            assert (await alice.job("alice", "a1")).record is not None
            events = [e async for e in alice.events("alice", "a1", 1)]
            assert [type(e.data) for e in events] == [JobAccepted]
            assert [c.data async for c in alice.output("alice", "a1", 1)] == [b"hello\n"]
            assert await alice.shares() is None
            assert await alice.stride() is None
            assert await alice.nodes() == []
            assert await alice.why("alice", "a1") is not None
        refused = [e for e in logs if "violation" in str(e).lower() or e["log_level"] == "error"]
        assert refused == []
