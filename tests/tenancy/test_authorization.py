"""What a tenant can and cannot do on a server running the shipped authorization."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence

import nats.errors
import pytest
from nats.aio.msg import Msg

from gfair.bus.nats_bus import NatsBus
from gfair.bus.topology import ConsumerSpec
from gfair.bus.transport import BusError
from gfair.events.codec import decode, encode, publish_headers
from gfair.events.envelope import Envelope, EventData
from gfair.events.errors import InvalidEvent
from gfair.events.jobs import JobAccepted, JobLaunch
from gfair.events.subjects import JOBS_STREAM, command_subject
from gfair.events.submission import JobCancelRequested, JobSubmitted
from gfair.state import buckets
from gfair.tenancy import consumer_create_subject
from gfair_services.topology import cluster_topology
from support.waiting import consistently, eventually

from .conftest import PASSWORDS, SERVICES_USER, Connection, Logins

pytestmark = pytest.mark.nats

STREAM = JOBS_STREAM.name


def submission(user: str, job_id: str = "job-1") -> JobSubmitted:
    return JobSubmitted(user=user, job_id=job_id, gpus=1, command=("python", "train.py"))


def accepted(user: str, job_id: str = "job-1") -> JobAccepted:
    return JobAccepted(user=user, job_id=job_id, gpus=1, launch=JobLaunch(command=("true",)))


async def publish(bus: NatsBus, data: EventData, subject: str | None = None) -> int:
    envelope = Envelope.wrap(data, source="tenancy-test", subject=subject)
    ack = await bus.publish(
        envelope.subject, encode(envelope), headers=publish_headers(envelope), msg_id=envelope.id
    )
    return ack.sequence


async def stored_subjects(bus: NatsBus) -> list[str]:
    return [message.subject async for message in bus.history(STREAM)]


async def services(logins: Logins) -> NatsBus:
    """The services' login, with the cluster's real topology in place."""
    bus = await logins.bus(SERVICES_USER)
    await bus.ensure_topology(cluster_topology())
    return bus


async def collect(connection: Connection, subject: str) -> list[Msg]:
    received: list[Msg] = []

    async def on_message(msg: Msg) -> None:
        received.append(msg)

    await connection.nc.subscribe(subject, cb=on_message)
    return received


async def create_consumer(
    connection: Connection, filter_subject: str, *, body_filter: str | Sequence[str] | None = None
) -> dict[str, object] | None:
    """Ask for a push consumer through the subject-filtered create API, delivering to the
    caller's inbox; the API's reply, or None when no reply came (a refused publish)."""
    name = f"c{uuid.uuid4().hex}"
    config: dict[str, object] = {
        "name": name,
        "ack_policy": "none",
        "deliver_subject": connection.nc.new_inbox(),
        "inactive_threshold": 5_000_000_000,
    }
    wanted = filter_subject if body_filter is None else body_filter
    if isinstance(wanted, str):
        config["filter_subject"] = wanted
    else:
        config["filter_subjects"] = list(wanted)
    request = json.dumps({"stream_name": STREAM, "config": config}).encode()
    try:
        reply = await connection.nc.request(
            consumer_create_subject(STREAM, name, filter_subject), request, timeout=1.0
        )
    except nats.errors.TimeoutError:
        return None
    answer: dict[str, object] = json.loads(reply.data)
    return answer


# --- what a tenant can do ----------------------------------------------------------------------


async def test_a_tenant_submits_and_cancels_its_own_jobs_into_the_stream(logins: Logins) -> None:
    operator = await services(logins)
    alice = await logins.bus("alice")
    # No inbox prefix given: the bus derives _INBOX_alice from the user, which is what the
    # shipped authorization lets alice receive JetStream acknowledgements on.
    assert alice.client._inbox_prefix == bytearray(b"_INBOX_alice")

    await publish(alice, submission("alice"))
    await publish(alice, JobCancelRequested(user="alice", job_id="job-1"))

    assert await stored_subjects(operator) == ["gfair.submit.alice", "gfair.cancel.alice"]


async def test_a_tenant_follows_its_own_job_events_live(logins: Logins) -> None:
    operator = await services(logins)
    alice = await logins.connection("alice")
    received = await collect(alice, "gfair.job.alice.>")
    await alice.nc.flush()

    # Bob's first: the server delivers one publisher's messages in order, so once alice's has
    # arrived, bob's would have arrived before it.
    await publish(operator, accepted("bob"))
    await publish(operator, accepted("alice"))

    for _ in range(500):  # up to 10 s on a loaded machine
        if received:
            break
        await asyncio.sleep(0.02)
    assert [m.subject for m in received] == ["gfair.job.alice.job-1.accepted"]
    assert await alice.violations() == []


# --- what a tenant cannot do ---------------------------------------------------------------------


async def test_a_tenant_cannot_submit_or_cancel_for_another_tenant(logins: Logins) -> None:
    operator = await services(logins)
    alice = await logins.connection("alice")

    for data in (submission("bob"), JobCancelRequested(user="bob", job_id="job-1")):
        envelope = Envelope.wrap(data, source="mallory")
        await alice.nc.publish(envelope.subject, encode(envelope))
        refused = await alice.refusal()
        assert envelope.subject.lower() in refused

    assert await stored_subjects(operator) == []


async def test_a_refused_submission_fails_the_publish_instead_of_hanging(logins: Logins) -> None:
    await services(logins)
    alice = await logins.bus("alice", publish_attempt_timeout_s=0.3, publish_deadline_s=0.5)
    with pytest.raises(BusError):
        await publish(alice, submission("bob"))


async def test_a_tenant_cannot_follow_other_tenants_events_live(logins: Logins) -> None:
    operator = await services(logins)
    alice = await logins.connection("alice")
    received: list[Msg] = []
    patterns = ("gfair.job.bob.>", "gfair.job.>", "gfair.submit.*", "gfair.node.>", "gfair.sched.>")
    for pattern in (*patterns, ">", "_INBOX.>", "_INBOX_bob.>"):
        received += await collect(alice, pattern)
        refused = await alice.refusal()
        assert pattern.lower() in refused

    await publish(operator, accepted("bob"))
    await publish(operator, submission("bob"))
    await consistently(lambda: received == [], 0.2)


@pytest.mark.parametrize(
    "pattern",
    ["gfair.job.alice.>", "gfair.job.alice.job-1.>", "gfair.job.bob.>", "gfair.job.>", ">"],
)
async def test_a_tenant_cannot_create_a_consumer_even_on_its_own_subjects(
    logins: Logins, pattern: str
) -> None:
    """Whether a consumer is durable, and where it delivers, is in the request body, which
    permissions cannot see: so no consumer at all. Her history comes from the query service."""
    operator = await services(logins)
    await publish(operator, accepted("bob"))
    alice = await logins.connection("alice")

    assert await create_consumer(alice, pattern) is None
    refused = await alice.refusal()
    assert "$js.api.consumer.create" in refused.lower()


@pytest.mark.parametrize("durable", ["placement-jobs", "anybody-else"])
async def test_a_tenant_cannot_refilter_anyones_consumer(logins: Logins, durable: str) -> None:
    operator = await services(logins)
    spec = ConsumerSpec(stream=STREAM, durable=durable, filter_subjects=("gfair.submit.*",))
    await operator.ensure_consumer(spec)
    alice = await logins.connection("alice")
    request = {
        "stream_name": STREAM,
        "config": {
            "name": durable,
            "durable_name": durable,
            "filter_subject": "gfair.job.alice.>",
            "ack_policy": "explicit",
        },
    }

    with pytest.raises(nats.errors.TimeoutError):
        await alice.nc.request(
            consumer_create_subject(STREAM, durable, "gfair.job.alice.>"),
            json.dumps(request).encode(),
            timeout=1.0,
        )

    assert await alice.refusal()
    info = await operator.client.jetstream().consumer_info(STREAM, durable)
    assert info.config.filter_subject == "gfair.submit.*"


async def test_a_tenant_cannot_use_the_jetstream_api(
    logins: Logins,
) -> None:
    operator = await services(logins)
    await operator.ensure_consumer(
        ConsumerSpec(stream=STREAM, durable="placement-jobs", filter_subjects=("gfair.submit.*",))
    )
    await publish(operator, submission("bob"))
    alice = await logins.connection("alice")
    forbidden = [
        f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.placement-jobs",  # pull another's deliveries
        f"$JS.API.STREAM.MSG.GET.{STREAM}",  # read any stored message
        f"$JS.API.DIRECT.GET.{STREAM}",
        f"$JS.API.STREAM.INFO.{STREAM}",  # lists subjects: other users and their job ids
        f"$JS.API.STREAM.DELETE.{STREAM}",
        f"$JS.API.STREAM.PURGE.{STREAM}",
        f"$JS.API.CONSUMER.DELETE.{STREAM}.placement-jobs",
        f"$JS.API.CONSUMER.LIST.{STREAM}",
        f"$JS.API.CONSUMER.CREATE.{STREAM}",  # the unfiltered ephemeral create
        "$JS.API.STREAM.CREATE.MINE",
        "$JS.API.STREAM.NAMES",
        "$JS.API.STREAM.LIST",
        "$JS.API.INFO",
    ]
    for subject in forbidden:
        await alice.nc.publish(subject, b"{}", reply=alice.nc.new_inbox())
        refused = await alice.refusal()
        assert subject.lower() in refused.lower()

    assert await stored_subjects(operator) == ["gfair.submit.bob"]
    assert (await operator.client.jetstream().consumer_info(STREAM, "placement-jobs")).config


async def test_a_tenant_cannot_touch_buckets_commands_or_service_events(logins: Logins) -> None:
    operator = await services(logins)
    bucket = buckets.ALL[0].name
    kv = await operator.key_value(bucket)
    await kv.put("probe", b"secret")
    alice = await logins.connection("alice")

    forged = (
        f"$KV.{bucket}.probe",
        command_subject("gpu-node-1", "start"),
        "gfair.node.gpu-node-1.heartbeat",
        "gfair.sched.tick",
        "gfair.job.alice.job-1.completed",  # even her own job's events come from services only
    )
    for subject in forged:
        await alice.nc.publish(subject, b"forged")
        refused = await alice.refusal()
        assert subject.lower() in refused.lower()
    watched = await collect(alice, f"$KV.{bucket}.>")
    assert await alice.refusal()

    await kv.put("probe", b"changed")
    await consistently(lambda: watched == [], 0.1)
    entry = await kv.get("probe")
    assert entry is not None and entry.value == b"changed"
    for stream in ("GFAIR_COMMANDS", "GFAIR_NODES", "GFAIR_SCHED", STREAM):
        assert [m async for m in operator.history(stream)] == []


async def test_a_tenant_with_the_wrong_password_is_refused_at_once(logins: Logins) -> None:
    with pytest.raises(BusError, match="refused the credentials") as refused:
        # Refused outright, not retried until the 30 s deadline.
        login = logins.bus("alice", password=PASSWORDS["bob"], initial_connect_deadline_s=30.0)
        await asyncio.wait_for(login, 10.0)
    assert PASSWORDS["bob"] not in str(refused.value)


# --- operators and services ----------------------------------------------------------------------


async def test_the_operator_can_do_everything_a_tenant_cannot(logins: Logins) -> None:
    services_bus = await services(logins)
    operator = await logins.connection("operator")
    operator_bus = await logins.bus("operator")
    live = await collect(operator, "gfair.job.>")

    await publish(operator_bus, submission("bob"))
    await publish(operator_bus, JobCancelRequested(user="alice", job_id="job-1"))
    await publish(services_bus, accepted("bob"))
    await publish(operator_bus, accepted("alice"))
    answer = await create_consumer(operator, "gfair.job.>")
    kv = await operator_bus.key_value(buckets.ALL[0].name)
    await kv.put("probe", b"by-operator")
    await operator.nc.publish(command_subject("gpu-node-1", "kill"), b"{}")

    assert await operator.violations() == []
    assert answer is not None and "error" not in answer, answer
    assert (await kv.get("probe")) is not None
    accepted_both = ["gfair.job.alice.job-1.accepted", "gfair.job.bob.job-1.accepted"]
    await eventually(lambda: sorted(m.subject for m in live) == accepted_both)
    assert await stored_subjects(services_bus) == [
        "gfair.submit.bob",
        "gfair.cancel.alice",
        "gfair.job.bob.job-1.accepted",
        "gfair.job.alice.job-1.accepted",
    ]


async def test_a_forged_submission_from_a_full_rights_login_is_refused_by_the_codec(
    logins: Logins,
) -> None:
    """Permissions cannot see inside a payload. A login that may publish anywhere (a service
    with a bug, a leaked service password) can put bob's job on alice's subject; the services
    decode with the subject it arrived on, and refuse it."""
    operator = await services(logins)
    await publish(operator, submission("bob", "forged"), subject="gfair.submit.alice")
    await publish(operator, submission("alice", "honest"))

    stored = [message async for message in operator.history(STREAM)]
    assert [m.subject for m in stored] == ["gfair.submit.alice", "gfair.submit.alice"]
    forged, honest = stored
    with pytest.raises(InvalidEvent, match="subject"):
        decode(forged.data, subject=forged.subject)
    decoded = decode(honest.data, subject=honest.subject)
    assert isinstance(decoded.data, JobSubmitted) and decoded.data.user == "alice"


async def test_a_node_that_starts_first_waits_for_the_services_to_declare_the_topology(
    logins: Logins,
) -> None:
    # A node login may only read the services' streams and buckets: started before the
    # services, it waits for them rather than failing its start-up (and restarting).
    node = await logins.bus("node-sim-1")
    waiting = asyncio.create_task(node.ensure_topology(cluster_topology()))
    for _ in range(200):  # until the server has refused it a stream
        if node._events is not None and node._events.denied:
            break
        await asyncio.sleep(0.05)
    assert node._events is not None
    assert {s for s in node._events.denied if s.startswith("$js.api.stream.create.")}
    assert not waiting.done()
    await services(logins)
    await asyncio.wait_for(waiting, 10)  # declared by the services: the node goes on
