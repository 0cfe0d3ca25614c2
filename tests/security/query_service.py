"""The real query service in this process, on a real nats-server running the shipped
authorization, with a cluster's streams and one job record of alice's to read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from opentelemetry import trace

from client.test_explanation import record
from gfair.bus.job_output import OutputChunk, publish_chunk
from gfair.bus.nats_bus import NatsBus
from gfair.bus.publisher import EventPublisher
from gfair.events.jobs import JobAccepted, JobLaunch
from gfair.events.states import JobState
from gfair.state import buckets
from gfair_services.query import QueryService, QuerySettings
from gfair_services.topology import cluster_topology
from tenancy.conftest import SERVICES_USER, Logins

QUERY_USER = "gfair-query"


async def cluster_state(logins: Logins) -> NatsBus:
    """The services' bus, with the cluster's topology and alice's job ``a1``: its record, an
    event and a line of output, so that every read the service makes touches the server."""
    bus = await logins.bus(SERVICES_USER)
    await bus.ensure_topology(cluster_topology())
    job = record("a1", 1, JobState.QUEUED, user="alice")
    await (await bus.key_value(buckets.JOBS.name)).put(job.key, job.to_bytes())
    await EventPublisher(bus, "test").publish(
        JobAccepted(user="alice", job_id="a1", gpus=1, launch=JobLaunch(command=("true",)))
    )
    chunk = OutputChunk(output="stdout", node="sim-1", run="r1", offset=0, data=b"hello\n")
    await publish_chunk(bus, "alice", "a1", chunk)
    return bus


@contextlib.asynccontextmanager
async def query_service(
    logins: Logins, *, user: str = QUERY_USER, settings: QuerySettings | None = None
) -> AsyncIterator[QueryService]:
    """The query service logged in as `user`, answering until the block ends."""
    bus = await logins.bus(user)
    service = QueryService(bus, settings or QuerySettings(), trace.get_tracer("test"))
    running = asyncio.create_task(service.run())
    try:
        # Subscribed once a question gets through: ask until one is answered.
        yield service
    finally:
        service.stop()
        await asyncio.wait_for(running, 10)


async def answering(logins: Logins, tenant: str = "alice") -> None:
    """Return once the service answers `tenant` (its subscription is in place)."""
    connection = await logins.connection(tenant)
    for _ in range(100):
        try:
            await connection.nc.request(f"gfair.query.{tenant}.jobs", b"{}", timeout=0.5)
            return
        except Exception:  # not subscribed yet: no responders, or a timeout
            await asyncio.sleep(0.05)
    raise AssertionError("the query service never answered")
