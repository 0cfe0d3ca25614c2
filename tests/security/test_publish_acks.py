"""Issue 41, hole 1: JetStream's publish ack went to whatever reply subject a tenant named.

The server sends a stored message's ack itself, so no permission of the tenant's applies to it:
alice's submission with reply ``$KV.gfair_jobs.bob.<id>`` replaced bob's job record with
``{"stream":"GFAIR_JOBS","seq":35}``, and one with ``$KV.gfair_stride.state`` stopped every
start in the cluster. Each tenant now logs in to an account of its own, which imports its
submission, cancellation and question subjects from the services' account as services: a reply
subject it names stays in its account, where there is no stream or bucket to write. Tested on a
real nats-server running the shipped configuration.
"""

from __future__ import annotations

import pytest

from gfair.bus.nats_bus import NatsBus
from gfair.events.codec import encode, publish_headers
from gfair.events.envelope import Envelope
from gfair.events.submission import JobCancelRequested, JobSubmitted
from gfair.state import buckets
from gfair_services.topology import cluster_topology
from support.waiting import consistently
from tenancy.conftest import SERVICES_USER, Logins

pytestmark = pytest.mark.nats

BOB_RECORD = b'{"user": "bob", "job_id": "b1"}'
STRIDE_STATE = b'{"version": 1}'


async def records(bus: NatsBus) -> dict[str, bytes | None]:
    """The two records the attack aimed at, as stored now."""
    found: dict[str, bytes | None] = {}
    for bucket, key in ((buckets.JOBS.name, "bob.b1"), (buckets.STRIDE.name, "state")):
        entry = await (await bus.key_value(bucket)).get(key)
        found[f"{bucket}/{key}"] = None if entry is None else entry.value
    return found


async def test_a_tenants_reply_subject_cannot_aim_the_jetstream_ack_at_any_record(
    logins: Logins,
) -> None:
    services = await logins.bus(SERVICES_USER)
    await services.ensure_topology(cluster_topology())
    await (await services.key_value(buckets.JOBS.name)).put("bob.b1", BOB_RECORD)
    await (await services.key_value(buckets.STRIDE.name)).put("state", STRIDE_STATE)
    before = await records(services)
    stream_before = (await services.client.jetstream().stream_info("GFAIR_JOBS")).state.messages

    alice = await logins.connection("alice")
    targets = (
        "$KV.gfair_jobs.bob.b1",
        "$KV.gfair_stride.state",
        "$JS.API.STREAM.PURGE.KV_gfair_jobs",
        "$JS.API.STREAM.DELETE.GFAIR_JOBS",
    )
    for index, reply in enumerate(targets):
        for data in (
            JobSubmitted(user="alice", job_id=f"a{index}", gpus=1, command=("python", "t.py")),
            JobCancelRequested(user="alice", job_id=f"a{index}"),
        ):
            envelope = Envelope.wrap(data, source="hostile-tenant")
            await alice.nc.publish(
                envelope.subject, encode(envelope), reply=reply, headers=publish_headers(envelope)
            )
    await alice.nc.flush()
    # Her own submission is still stored and acked to her (the import carries the reply back).
    envelope = Envelope.wrap(
        JobSubmitted(user="alice", job_id="fair", gpus=1, command=("python", "t.py")),
        source="tenant",
    )
    ack = await alice.nc.request(
        envelope.subject, encode(envelope), timeout=5, headers=publish_headers(envelope)
    )
    assert b'"stream":"GFAIR_JOBS"' in ack.data

    async def unchanged() -> bool:
        return await records(services) == before

    await consistently(unchanged, 0.2)
    info = await services.client.jetstream().stream_info("GFAIR_JOBS")
    # Every hostile message was stored as the submission or cancel it was, and nothing purged.
    assert info.state.messages == stream_before + 2 * len(targets) + 1
    assert alice.errors == []
