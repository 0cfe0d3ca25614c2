"""An embedded cluster with authorization (`gfair up --auth`): every process logs in with its
own password, a tenant runs its own jobs and touches nobody else's, strangers are refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.msg import Msg
from nats.js.api import ConsumerInfo
from nats.js.client import JetStreamContext

from gfair.client import ClientError, ConnectOptions, GfairClient, UsersView
from gfair.cluster_logins import Login
from gfair.embedded_cluster import EmbeddedCluster
from gfair.events.states import JobState
from gfair.events.subjects import STREAMS
from gfair.tenancy import SERVICE_DURABLES
from support.waiting import eventually
from tenancy.conftest import Connection

from .conftest import StartCluster, synthetic

pytestmark = pytest.mark.nats

TENANTS = """
[[tenants]]
name = "alice"

[[tenants]]
name = "bob"
"""


@pytest.fixture
def tenants_file(tmp_path: Path) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(TENANTS)
    return path


def login_of(cluster: EmbeddedCluster, user: str) -> Login:
    assert cluster.logins is not None
    if user == cluster.logins.operator.user:
        return cluster.logins.operator
    (found,) = (login for login in cluster.logins.tenant_logins if login.user == user)
    return found


async def client_as(cluster: EmbeddedCluster, user: str) -> GfairClient:
    login = login_of(cluster, user)
    options = ConnectOptions(servers=(cluster.nats_url,), user=login.user, password=login.password)
    return await GfairClient.connect(options=options, poll_interval_s=0.05)


async def connection_as(cluster: EmbeddedCluster, user: str) -> Connection:
    """A plain connection logged in as `user`, keeping what the server reports to it."""
    login = login_of(cluster, user)
    connection = Connection(nats.aio.client.Client())
    await connection.nc.connect(
        servers=[cluster.nats_url],
        user=login.user,
        password=login.password,
        inbox_prefix=f"_INBOX_{login.user}",
        max_reconnect_attempts=0,
        error_cb=connection.on_error,
    )
    return connection


async def consumers(js: JetStreamContext, stream: str) -> list[ConsumerInfo]:
    return await js.consumers_info(stream)


async def test_a_tenant_runs_its_own_job_and_is_refused_anyone_elses(
    start_cluster: StartCluster, tenants_file: Path
) -> None:
    async with start_cluster(cluster="v100:1x2", auth=tenants_file) as cluster:
        # Every process has a login of its own: the executor the node's, never the services'.
        executor = cluster.children["v100-0"].env
        assert executor["GFAIR_NATS_USER"] == "node-v100-0"
        assert cluster.logins is not None
        assert executor["GFAIR_NATS_PASSWORD"] == cluster.logins.node("v100-0").password
        assert cluster.children["placement"].env["GFAIR_NATS_USER"] == "gfair-services"
        # The query service answers on reply subjects tenants choose: a login of its own.
        assert cluster.children["query"].env["GFAIR_NATS_USER"] == "gfair-query"
        assert cluster.children["query"].env["GFAIR_NATS_PASSWORD"] == cluster.logins.query.password
        # Each durable consumer of the running cluster is denied to that login by name.
        admin = await connection_as(cluster, "operator")
        js = admin.nc.jetstream()
        durables = {
            info.name
            for stream in STREAMS
            for info in await consumers(js, stream.name)
            if info.config.durable_name
        }
        denied = set(SERVICE_DURABLES) | {node.durable for node in cluster.logins.tenants.nodes}
        assert durables and durables <= denied, durables - denied
        await admin.nc.close()

        alice = await connection_as(cluster, "alice")
        live: list[str] = []

        async def follow(msg: Msg) -> None:
            live.append(msg.subject)

        await alice.nc.subscribe("gfair.job.alice.>", cb=follow)
        await alice.nc.flush()
        assert await alice.violations() == []

        tenant = await client_as(cluster, "alice")
        async with tenant:
            submitted = await tenant.submit(
                "alice", 1, synthetic(iterations=20), wait="none", name="own"
            )
        operator = await client_as(cluster, "operator")
        async with operator:
            state = await _ended(operator, "alice", submitted.job_id)
            assert state is JobState.COMPLETED
            record = (await operator.job("alice", submitted.job_id)).record
            assert record is not None and record.servers == ("v100-0",)
        # She followed her job live, on her own subjects.
        completed = f"gfair.job.alice.{submitted.job_id}.completed"
        await eventually(lambda: completed in live, 5, 0.05, what=f"{completed} in {live}")

        # Bob's subjects, and everybody's, are refused to her.
        await alice.nc.publish("gfair.submit.bob", b"{}")
        assert "gfair.submit.bob" in await alice.refusal()
        await alice.nc.subscribe("gfair.job.bob.>")
        assert "gfair.job.bob.>" in await alice.refusal()
        await alice.nc.subscribe("gfair.job.>")
        assert "gfair.job.>" in await alice.refusal()
        await alice.nc.publish("gfair.cmd.v100-0.start", b"{}")
        assert "gfair.cmd.v100-0.start" in await alice.refusal()
        await alice.nc.close()
    after = await asyncio.to_thread(tenants_file.read_text)
    assert after == TENANTS, "the user's tenants file is only read"


async def _ended(client: GfairClient, user: str, job_id: str) -> JobState:
    async for event in client.watch(user, job_id, timeout_s=90):
        state = getattr(event.data, "JOB_STATE", None)
        if state is not None and JobState(state).terminal:
            return JobState(state)
    raise AssertionError(f"{user}/{job_id} did not end within 90 s")


async def test_without_a_login_or_with_a_wrong_password_nobody_gets_in(
    start_cluster: StartCluster, tenants_file: Path
) -> None:
    async with start_cluster(cluster="v100:1x1", auth=tenants_file) as cluster:
        alice = login_of(cluster, "alice")
        for credentials in (
            {},
            {"user": "alice", "password": "not-" + alice.password},
            # The password of one tenant is no key to another.
            {"user": "bob", "password": alice.password},
        ):
            with pytest.raises(nats.errors.Error) as refused:
                await nats.connect(
                    cluster.nats_url,
                    allow_reconnect=False,
                    max_reconnect_attempts=0,
                    error_cb=_ignore,
                    **credentials,
                )
            assert "authorization violation" in str(refused.value).lower(), credentials
        # The right one gets in.
        connection = await connection_as(cluster, "alice")
        await connection.nc.close()


async def _ignore(exc: Exception) -> None:
    del exc


async def test_a_tenants_client_reads_its_own_jobs_and_nothing_else(
    start_cluster: StartCluster, tenants_file: Path
) -> None:
    async with start_cluster(cluster="v100:1x2", auth=tenants_file) as cluster:
        bob = await client_as(cluster, "bob")
        async with bob:
            theirs = await bob.submit("bob", 1, synthetic(duration_s=120), wait="running")
            assert theirs.state is JobState.RUNNING

            async def counted() -> UsersView | None:  # until the auction has counted his job
                view = await bob.users()
                # Usage (split-stride's) can name him before the auction's shares exist.
                return view if view.users and view.users[0].tickets is not None else None

            view = await eventually(counted, 10, 0.1, what="the auction counting bob's job")
            assert [u.user for u in view.users] == ["bob"]
            assert view.capacity == {"v100": 2}
        alice = await client_as(cluster, "alice")
        async with alice:
            ran = await alice.submit("alice", 1, synthetic(iterations=20), wait="ended")
            assert ran.state is JobState.COMPLETED, ran
            assert await alice.wait("alice", ran.job_id, timeout_s=30) is JobState.COMPLETED
            assert [(j.user, j.job_id) for j in await alice.jobs()] == [("alice", ran.job_id)]
            details = await alice.job("alice", ran.job_id)
            kinds = [type(e.data).__name__ for e in details.events]
            assert kinds[0] == "JobAccepted" and kinds[-1] == "JobCompleted", kinds
            assert details.failures is not None  # the failure detector's record, cut to hers
            assert "completed" in (await alice.why("alice", ran.job_id)).headline
            nodes = await alice.nodes()
            assert [n.node_id for n in nodes] == ["v100-0"]
            assert all(ref.user == "alice" for node in nodes for ref in node.running)

            async def shipped() -> bool:  # executors ship output every second
                output = b"".join([c.data async for c in alice.output("alice", ran.job_id)])
                return b"synthetic" in output

            await eventually(shipped, 10, 0.1, what="alice's job output shipped")
            assert [e async for e in alice.events()] != []
            assert [s async for s in alice.cleared_trades()] == []
            with pytest.raises(ClientError, match="only alice's jobs"):
                await alice.jobs("bob")
            with pytest.raises(ClientError, match="only alice's jobs"):
                await alice.job("bob", theirs.job_id)
            # Asking on bob's subject anyway is refused by NATS, not answered.
            connection = await connection_as(cluster, "alice")
            with pytest.raises(nats.errors.Error):
                await connection.nc.request("gfair.query.bob.jobs", b"{}", timeout=1)
            assert "gfair.query.bob.jobs" in await connection.refusal()
            await connection.nc.close()
