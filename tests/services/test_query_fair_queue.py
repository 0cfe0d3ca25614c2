"""The query service's queue: tenants take turns, each within its concurrency, rate and bound."""

from __future__ import annotations

import asyncio

import pytest

from gfair_services.query.fair_queue import FairQueue, Limits, QueueFull
from support.clock import FakeClock


def limits(**overrides: float) -> Limits:
    values: dict[str, float] = {
        "slots": 4,
        "per_tenant": 4,
        "rate": 1.0,
        "burst": 100,
        "queue": 100,
    }
    values |= overrides
    return Limits(**values)  # type: ignore[arg-type]


async def take_now(queue: FairQueue[str]) -> tuple[str, str] | None:
    """What `take` gives without waiting, or None."""
    try:
        return await asyncio.wait_for(queue.take(), 0.01)
    except TimeoutError:
        return None


async def test_tenants_take_turns_whoever_asked_first() -> None:
    queue: FairQueue[str] = FairQueue(limits(slots=1), clock=FakeClock().seconds)
    for i in range(5):
        queue.put("alice", f"a{i}")
    queue.put("bob", "b0")
    queue.put("bob", "b1")
    order = []
    for _ in range(7):
        tenant, item = await queue.take()
        order.append(item)
        queue.done(tenant)
    # Bob came last but is served every other turn, not after alice's five.
    assert order[:4] == ["a0", "b0", "a1", "b1"] or order[:4] == ["b0", "a0", "b1", "a1"]
    assert sorted(order) == ["a0", "a1", "a2", "a3", "a4", "b0", "b1"]


async def test_a_tenant_has_at_most_its_own_share_of_slots_at_once() -> None:
    queue: FairQueue[str] = FairQueue(limits(slots=4, per_tenant=2), clock=FakeClock().seconds)
    for i in range(4):
        queue.put("alice", f"a{i}")
    assert await take_now(queue) == ("alice", "a0")
    assert await take_now(queue) == ("alice", "a1")
    assert await take_now(queue) is None  # two slots free, but not for alice
    queue.put("bob", "b0")
    assert await take_now(queue) == ("bob", "b0")
    queue.done("alice")
    assert await take_now(queue) == ("alice", "a2")


async def test_a_tenants_rate_is_its_token_bucket() -> None:
    clock = FakeClock()
    queue: FairQueue[str] = FairQueue(limits(rate=2.0, burst=2), clock=clock.seconds)
    for i in range(4):
        queue.put("alice", f"a{i}")
    assert await take_now(queue) == ("alice", "a0")
    assert await take_now(queue) == ("alice", "a1")
    assert await take_now(queue) is None  # the burst is spent
    queue.put("bob", "b0")
    assert await take_now(queue) == ("bob", "b0")  # bob's bucket is his own
    clock.at(0.5)  # one token at 2 a second
    assert await take_now(queue) == ("alice", "a2")
    assert await take_now(queue) is None


async def test_a_full_queue_refuses_at_once_naming_the_tenant() -> None:
    queue: FairQueue[str] = FairQueue(limits(queue=2), clock=FakeClock().seconds)
    queue.put("alice", "a0")
    queue.put("alice", "a1")
    with pytest.raises(QueueFull, match="too many questions in flight for alice; retry later"):
        queue.put("alice", "a2")
    queue.put("bob", "b0")  # other tenants' queues are theirs
    assert queue.waiting("alice") == 2


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        limits(rate=0)
