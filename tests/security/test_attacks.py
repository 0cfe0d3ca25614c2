"""Issue 11's attacks, one test each, against a real nats-server running the rendered
authorization (deploy/nats) and the real services. docs/security.md lists them.

The attacks the earlier audit found are tested where their code lives:
a job's environment holds no NATS credentials and a setsid child dies on cancel
(tests/node/test_supervisor.py), tickets of 1e-310 are refused (tests/events/test_validation.py,
tests/core/test_tickets.py), a tenant cannot touch other tenants' subjects, buckets or commands
(tests/tenancy/test_authorization.py), the monitoring port (tests/deploy/test_compose.py).
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import nats.errors
import pytest
from nats.aio.msg import Msg

from gfair.bus.job_output import OutputChunk, publish_chunk, read_output
from gfair.bus.nats_bus import NatsBus
from gfair.bus.runtime import ServiceRuntime
from gfair.core.throughput import ThroughputEstimator
from gfair.events.codec import encode, publish_headers
from gfair.events.envelope import Envelope, EventData
from gfair.events.jobs import JobAccepted, JobExited, JobLaunch, JobRejected, JobStarted
from gfair.events.nodes import NodeFailed, NodeHeartbeat
from gfair.events.reasons import RejectionCode
from gfair.events.subjects import STREAMS, command_subject
from gfair.events.submission import JobSubmitted
from gfair.state import buckets
from gfair.state.job_record import load_job
from gfair.tenancy import consumer_create_subject
from gfair_services.placement import PlacementService, PlacementSettings
from gfair_services.topology import cluster_topology
from support.waiting import eventually
from tenancy.conftest import SERVICES_USER, Connection, Logins

pytestmark = pytest.mark.nats

JOBS = "GFAIR_JOBS"


async def services(logins: Logins) -> NatsBus:
    bus = await logins.bus(SERVICES_USER)
    await bus.ensure_topology(cluster_topology())
    return bus


async def publish(bus: NatsBus, data: EventData, *, time: datetime | None = None) -> None:
    envelope = Envelope.wrap(data, source="security-test", time=time)
    await bus.publish(
        envelope.subject, encode(envelope), headers=publish_headers(envelope), msg_id=envelope.id
    )


async def create_consumer(connection: Connection, name: str, config: dict[str, object]) -> object:
    """The consumer-create API as a tenant calls it; its answer, or None if refused."""
    filter_subject = str(config["filter_subject"])
    request = json.dumps({"stream_name": JOBS, "config": {"name": name, **config}}).encode()
    try:
        reply = await connection.nc.request(
            consumer_create_subject(JOBS, name, filter_subject), request, timeout=1.0
        )
    except nats.errors.TimeoutError:
        return None
    return json.loads(reply.data)


async def submission(job_id: str) -> JobSubmitted:
    return JobSubmitted(user="alice", job_id=job_id, gpus=1, command=("python", "train.py"))


# --- consumers -----------------------------------------------------------------------------------


async def test_a_tenant_cannot_create_a_durable_through_the_durable_api(logins: Logins) -> None:
    await services(logins)
    alice = await logins.connection("alice")
    request = json.dumps(
        {"stream_name": JOBS, "config": {"durable_name": "mine", "ack_policy": "none"}}
    ).encode()
    with pytest.raises(nats.errors.TimeoutError):
        await alice.nc.request(f"$JS.API.CONSUMER.DURABLE.CREATE.{JOBS}.mine", request, timeout=1)
    assert "permissions violation" in (await alice.refusal()).lower()


async def test_a_tenant_cannot_create_a_durable_through_the_filtered_api(logins: Logins) -> None:
    operator = await services(logins)
    alice = await logins.connection("alice")
    config: dict[str, object] = {
        "durable_name": "kept",
        "filter_subject": "gfair.job.alice.>",
        "ack_policy": "none",
        "deliver_subject": alice.nc.new_inbox(),
    }
    assert await create_consumer(alice, "kept", config) is None
    assert "$js.api.consumer.create" in (await alice.refusal()).lower()
    names = [c.name for c in await operator.client.jetstream().consumers_info(JOBS)]
    assert "kept" not in names


async def test_a_push_consumer_aimed_at_another_subject_is_never_created(logins: Logins) -> None:
    """A consumer's delivery subject is in the request body; tenants may create no consumer,
    so none can aim one at a service's subject."""
    operator = await services(logins)
    alice = await logins.connection("alice")
    targets = (
        "gfair.node.n1.heartbeat",
        command_subject("n1", "start"),
        "gfair.sched.quantum",
        "gfair.dlq.GFAIR_JOBS",
    )
    for index, target in enumerate(targets):
        config = {
            "filter_subject": "gfair.job.alice.>",
            "ack_policy": "none",
            "deliver_subject": target,
        }
        assert await create_consumer(alice, f"aim{index}", config) is None
        assert "$js.api.consumer.create" in (await alice.refusal()).lower()
    assert await operator.client.jetstream().consumers_info(JOBS) == []


# --- ordering by the server's time ---------------------------------------------------------------


async def test_a_tenants_envelope_time_neither_dates_nor_orders_its_jobs(logins: Logins) -> None:
    operator = await services(logins)
    state = PlacementService(PlacementSettings(), ThroughputEstimator({}))
    alice = await logins.bus("alice")
    async with ServiceRuntime(state.service(), await logins.bus(SERVICES_USER)):
        before = datetime.now(UTC)
        await publish(alice, await submission("first"), time=before + timedelta(days=3650))
        await publish(alice, await submission("second"), time=datetime(2001, 1, 1, tzinfo=UTC))
        kv = await operator.key_value(buckets.JOBS.name)
        await eventually(lambda: load_job(kv, "alice", "second"), what="the second job stored")
        first = await load_job(kv, "alice", "first")
        second = await load_job(kv, "alice", "second")
    after = datetime.now(UTC)
    assert first is not None and second is not None
    times = [first.record.submission.submitted_at, second.record.submission.submitted_at]
    assert all(before - timedelta(seconds=1) <= t <= after + timedelta(seconds=1) for t in times)
    assert times[0] <= times[1]  # stream order, whatever the tenant wrote


# --- the pending cap -----------------------------------------------------------------------------


async def test_a_tenant_beyond_its_pending_cap_is_rejected_with_the_reason(logins: Logins) -> None:
    operator = await services(logins)
    state = PlacementService(PlacementSettings(max_pending_jobs=3), ThroughputEstimator({}))
    alice = await logins.connection("alice")
    answers: list[Envelope] = []

    async def on_answer(msg: Msg) -> None:
        answers.append(Envelope.model_validate_json(msg.data))

    await alice.nc.subscribe("gfair.job.alice.*.rejected", cb=on_answer)
    tenant = await logins.bus("alice")
    async with ServiceRuntime(state.service(), await logins.bus(SERVICES_USER)):
        for i in range(5):
            await publish(tenant, await submission(f"j{i}"))
        await eventually(
            lambda: len([a for a in answers if a.data["code"] == "too_many_pending"]) == 2,
            what="two submissions refused as too many pending",
        )
    refused = [JobRejected.model_validate(a.data) for a in answers]
    over = sorted(r.job_id for r in refused if r.code is RejectionCode.TOO_MANY_PENDING)
    assert over == ["j3", "j4"]
    assert all("max_pending_jobs 3" in r.reason for r in refused if r.job_id in over)
    kv = await operator.key_value(buckets.JOBS.name)
    assert await load_job(kv, "alice", "j4") is None  # no record: a flood grows no bucket


async def test_a_tenant_cannot_announce_an_admission_carrying_a_command(logins: Logins) -> None:
    """An admission carries the command a node runs as its job (`JobAccepted.launch`): only
    placement may announce one, for any user, the tenant's own included."""
    await services(logins)
    alice = await logins.connection("alice")
    for user in ("alice", "bob"):
        data = JobAccepted(
            user=user, job_id="j1", gpus=1, launch=JobLaunch(command=("sh", "-c", "id"))
        )
        envelope = Envelope.wrap(data, source="t")
        await alice.nc.publish(envelope.subject, encode(envelope))
        assert "permissions violation" in (await alice.refusal()).lower(), envelope.subject


# --- node executors ------------------------------------------------------------------------------


async def test_a_node_executor_cannot_speak_for_another_node(logins: Logins) -> None:
    operator = await services(logins)
    node = await logins.connection("node-sim-1")
    own = Envelope.wrap(NodeHeartbeat(node_id="sim-1", seq=0, running=()), source="t")
    await node.nc.publish(own.subject, encode(own))
    assert await node.violations() == []
    forbidden: list[EventData] = [
        NodeHeartbeat(node_id="gpu-1", seq=0, running=()),  # another node's report
        NodeFailed(node_id="sim-1", reason="forged"),  # a verdict, even on its own node
        JobAccepted(
            user="alice", job_id="j1", gpus=1, launch=JobLaunch(command=("true",))
        ),  # a decision, not a run report
        # a run report of a job on another node
        JobExited(user="alice", job_id="j1", node_id="gpu-1", attempt=1, exit_code=0, runtime_s=1),
    ]
    for data in forbidden:
        envelope = Envelope.wrap(data, source="t")
        await node.nc.publish(envelope.subject, encode(envelope))
        assert "permissions violation" in (await node.refusal()).lower(), envelope.subject
    # Nor another node's job output.
    await node.nc.publish("gfair.logs.alice.j1.stdout.gpu-1", b"forged")
    assert "permissions violation" in (await node.refusal()).lower()
    # Commands are the scheduler's, for any node, its own included.
    for target in ("gpu-1", "sim-1"):
        await node.nc.publish(command_subject(target, "start"), b"{}")
        assert "permissions violation" in (await node.refusal()).lower()
    # Another node's command consumer: neither created, nor pulled from, nor read live.
    name = "node-executor-gpu-1"
    await node.nc.publish(
        consumer_create_subject("GFAIR_COMMANDS", name, "gfair.cmd.gpu-1.*"), b"{}"
    )
    assert "permissions violation" in (await node.refusal()).lower()
    await node.nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.GFAIR_COMMANDS.{name}", b"1")
    assert "permissions violation" in (await node.refusal()).lower()
    await node.nc.subscribe("gfair.cmd.>")
    assert "permissions violation" in (await node.refusal()).lower()
    # Nor streams, buckets or other users' inboxes.
    await node.nc.publish("$JS.API.STREAM.DELETE.GFAIR_JOBS", b"")
    assert "permissions violation" in (await node.refusal()).lower()
    await node.nc.publish(f"$KV.{buckets.JOBS.name}.alice.j1", b"{}")
    assert "permissions violation" in (await node.refusal()).lower()
    stored = [m.subject async for m in operator.history("GFAIR_NODES")]
    assert stored == ["gfair.node.sim-1.heartbeat"]


async def test_a_node_executor_may_report_its_own_runs(logins: Logins) -> None:
    operator = await services(logins)
    node = await logins.bus("node-sim-1")
    await publish(
        node, JobStarted(user="alice", job_id="j1", node_id="sim-1", attempt=1, gpu_indices=(0,))
    )
    chunk = OutputChunk(output="stdout", node="sim-1", run="run-0001", offset=0, data=b"hi")
    await publish_chunk(node, "alice", "j1", chunk)
    stored = [m.subject async for m in operator.history(JOBS)]
    assert stored == ["gfair.job.alice.j1.started.sim-1"]
    assert [c async for c in read_output(operator, "alice", "j1")] == [replace(chunk, sequence=1)]


# --- streams -------------------------------------------------------------------------------------


async def test_every_stream_is_bounded(logins: Logins) -> None:
    operator = await services(logins)
    js = operator.client.jetstream()
    names = [s.name for s in STREAMS] + ["GFAIR_LOGS"]
    for name in names:
        config = (await js.stream_info(name)).config
        assert config.max_bytes is not None and config.max_bytes > 0, name
        assert config.discard == "old", name
        bounded_in_time = bool(config.max_age)
        bounded_per_subject = (config.max_msgs_per_subject or -1) > 0
        assert bounded_in_time or bounded_per_subject, name
    jobs = (await js.stream_info(JOBS)).config
    # One tenant flooding its own subject pushes out its own oldest messages only.
    assert (jobs.max_msgs_per_subject or -1) > 0
    assert jobs.max_msg_size is not None and jobs.max_msg_size > 0
