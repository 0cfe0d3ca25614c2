"""The query service's answers: about the user the subject names, and nobody else."""

from __future__ import annotations

import json

import pytest

from client.test_explanation import NOW, SHARES, record, stride
from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.publisher import EventPublisher
from gfair.client import GfairClient
from gfair.client import queries as queries_module
from gfair.client.queries import (
    EventsPage,
    JobsPage,
    NodesAnswer,
    SharesAnswer,
    StrideAnswer,
    WhyAnswer,
)
from gfair.client.state_access import DirectAccess
from gfair.events.fields import JobRef
from gfair.events.jobs import JobAccepted, JobLaunch, JobProgress
from gfair.events.reasons import FailureClass
from gfair.events.states import JobState, NodeState
from gfair.state.buckets import JOBS, NODES, STRIDE
from gfair.state.buckets import SHARES as SHARES_BUCKET
from gfair.state.node_record import NodeFailureEntry, NodeRecord
from gfair.state.share_record import SHARES_KEY, AccountShare, PoolShare, TradeRecord, UserShare
from gfair.state.stride_record import STATE_KEY
from gfair_services.query.responder import QueryResponder, Unanswerable
from gfair_services.query.scope import own_node, own_shares
from gfair_services.topology import cluster_topology


@pytest.fixture
async def bus() -> InMemoryBus:
    bus = InMemoryBus()
    await bus.ensure_topology(cluster_topology())
    return bus


def responder(bus: InMemoryBus) -> QueryResponder:
    access = DirectAccess(bus)
    return QueryResponder(access, GfairClient(bus, access=access))


async def ask(bus: InMemoryBus, subject: str, question: object = None) -> object:
    body = b"" if question is None else json.dumps(question).encode()
    return await responder(bus).answer(subject, body)


async def keep_jobs(bus: InMemoryBus, *jobs: tuple[str, str]) -> None:
    bucket = await bus.key_value(JOBS.name)
    for user, job_id in jobs:
        job = record(job_id, 1, JobState.QUEUED, user=user)
        await bucket.put(job.key, job.to_bytes())


async def test_a_user_is_told_of_its_own_jobs_only(bus: InMemoryBus) -> None:
    await keep_jobs(bus, ("alice", "a1"), ("bob", "b1"), ("alice", "a2"))
    page = await ask(bus, "gfair.query.alice.jobs", {})
    assert isinstance(page, JobsPage)
    assert [(r.user, r.job_id) for r in page.records] == [("alice", "a1"), ("alice", "a2")]
    assert page.next is None
    answer = await ask(bus, "gfair.query.alice.job", {"job_id": "b1"})
    assert answer.record is None  # type: ignore[attr-defined]


async def test_long_answers_come_in_pages(
    bus: InMemoryBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    await keep_jobs(bus, *(("alice", f"j{i:02d}") for i in range(7)))
    monkeypatch.setattr("gfair_services.query.responder.PAGE_BYTES", 2_000)
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        page = await ask(bus, "gfair.query.alice.jobs", {"after": after})
        assert isinstance(page, JobsPage)
        assert page.records, "every page holds at least one record"
        seen += [r.job_id for r in page.records]
        pages += 1
        if page.next is None:
            break
        after = page.next
    assert seen == [f"j{i:02d}" for i in range(7)]
    assert pages > 1
    assert queries_module.PAGE_BYTES > 2_000  # the patch stayed in the responder


async def test_events_are_the_users_own_and_page_by_sequence(
    bus: InMemoryBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher = EventPublisher(bus, "test")
    for user in ("alice", "bob"):
        await publisher.publish(
            JobAccepted(user=user, job_id="j", gpus=1, launch=JobLaunch(command=("true",)))
        )
    for step in range(1, 6):
        await publisher.publish(
            JobProgress(
                user="alice",
                job_id="j",
                node_id="n1",
                generation="v100",
                attempt=1,
                minibatches_per_s=10.0,
                iterations=step,
            )
        )
    monkeypatch.setattr("gfair_services.query.responder.PAGE_BYTES", 1_500)
    events = []
    start = 1
    while True:
        page = await ask(bus, "gfair.query.alice.events", {"job_id": "j", "start": start})
        assert isinstance(page, EventsPage)
        events += page.events
        if page.next is None:
            break
        start = page.next
    assert [e.subject.split(".")[2] for e in events] == ["alice"] * 6
    assert len({e.sequence for e in events}) == 6
    every = await ask(bus, "gfair.query.bob.events", {})
    assert isinstance(every, EventsPage)
    assert [e.envelope.type for e in every.events] == [JobAccepted.EVENT_TYPE]


async def test_the_scheduler_records_are_cut_to_the_user(bus: InMemoryBus) -> None:
    await (await bus.key_value(STRIDE.name)).put(STATE_KEY, stride().to_bytes())
    bob = UserShare(
        user="bob",
        tickets=1,
        jobs=1,
        demand=3,
        pools={"v100": PoolShare(fair=2, entitled=2)},
        throughput_fair=2,
        throughput_entitled=2,
    )
    shares = SHARES.model_copy(update={"users": {**SHARES.users, "bob": bob}})
    await (await bus.key_value(SHARES_BUCKET.name)).put(
        SHARES_KEY, shares.model_dump_json().encode()
    )
    cut = await ask(bus, "gfair.query.alice.shares")
    assert isinstance(cut, SharesAnswer) and cut.record is not None
    assert set(cut.record.users) == {"alice"}
    assert cut.record.capacity == {"v100": 4}
    seen = await ask(bus, "gfair.query.alice.stride")
    assert isinstance(seen, StrideAnswer) and seen.record is not None
    assert {j.user for j in seen.record.jobs.values()} == {"alice"}
    assert set(seen.record.users) == {"alice"}
    assert set(seen.record.servers) == {"v100-0"}  # the cluster's shape stays


INFRASTRUCTURE = FailureClass.INFRASTRUCTURE


def test_cuts_leave_other_users_out() -> None:
    shares = SHARES.model_copy(
        update={
            "trades": (
                TradeRecord(
                    buyer="alice", seller="bob", fast_pool="v100", slow_pool="k80",
                    quantity=1, price=2, buyer_bid=3, seller_bid=1,
                ),
                TradeRecord(
                    buyer="carol", seller="bob", fast_pool="v100", slow_pool="k80",
                    quantity=1, price=2, buyer_bid=3, seller_bid=1,
                ),
            )
        }
    )  # fmt: skip
    assert [t.buyer for t in own_shares(shares, "alice").trades] == ["alice"]
    tree = shares.model_copy(
        update={
            "accounts": {
                "lab": AccountShare(tickets=1, fair=1),
                "lab/vision": AccountShare(tickets=1, fair=1),
                "prod": AccountShare(tickets=1, fair=1),
            },
            "members": {"alice": "lab/vision", "bob": "prod"},
        }
    )
    own = own_shares(tree, "alice")
    assert (set(own.accounts), own.members) == ({"lab", "lab/vision"}, {"alice": "lab/vision"})
    assert own_shares(tree, "carol").accounts == {}
    node = NodeRecord(
        node_id="n1",
        state=NodeState.READY,
        state_since=NOW,
        running=(JobRef(user="alice", job_id="a"), JobRef(user="bob", job_id="b")),
        recent_failures=(
            NodeFailureEntry(
                time=NOW, failure_class=FailureClass.INFRASTRUCTURE, reason="xid", user="bob"
            ),
            NodeFailureEntry(time=NOW, failure_class=FailureClass.INFRASTRUCTURE, reason="ecc"),
        ),
    )
    mine = own_node(node, "alice")
    assert [r.user for r in mine.running] == ["alice"]
    assert [f.reason for f in mine.recent_failures] == ["ecc"]


async def test_why_names_no_other_users_job(bus: InMemoryBus) -> None:
    job = record("wide", 2, JobState.PLACED, servers=("v100-0",), generation="v100")
    await (await bus.key_value(JOBS.name)).put(job.key, job.to_bytes())
    await (await bus.key_value(STRIDE.name)).put(STATE_KEY, stride().to_bytes())
    await (await bus.key_value(NODES.name)).put(
        "v100-0",
        NodeRecord(node_id="v100-0", state=NodeState.READY, state_since=NOW)
        .model_dump_json()
        .encode(),
    )
    answer = await ask(bus, "gfair.query.alice.why", {"job_id": "wide"})
    assert isinstance(answer, WhyAnswer)
    text = "\n".join(answer.explanation.lines())
    assert "held by another user's job (3)" in text
    assert "bob" not in text


@pytest.mark.parametrize(
    ("subject", "body", "says"),
    [
        ("gfair.query.alice.secrets", {}, "no query 'secrets'"),
        ("gfair.query.alice.job", {}, "job_id"),
        ("gfair.query.alice.job", {"job_id": "a.b"}, "job_id"),
        ("gfair.query.alice.events", {"start": 0}, "start"),
        ("gfair.query.alice.jobs", {"user": "bob"}, "user"),
        ("gfair.query.al ice.jobs", {}, "user"),
    ],
)
async def test_a_bad_question_gets_a_reason(
    bus: InMemoryBus, subject: str, body: object, says: str
) -> None:
    with pytest.raises(Unanswerable, match=says):
        await ask(bus, subject, body)


async def test_nodes_are_listed_with_the_users_jobs_only(bus: InMemoryBus) -> None:
    node = NodeRecord(
        node_id="n1",
        state=NodeState.READY,
        state_since=NOW,
        running=(JobRef(user="alice", job_id="a"), JobRef(user="bob", job_id="b")),
    )
    await (await bus.key_value(NODES.name)).put("n1", node.model_dump_json().encode())
    answer = await ask(bus, "gfair.query.bob.nodes")
    assert isinstance(answer, NodesAnswer)
    assert [[r.job_id for r in n.running] for n in answer.records] == [["b"]]
