"""Key-value buckets: revisions, compare-and-set, deletes and watches, on both buses."""

from __future__ import annotations

import asyncio

import pytest

from gfair.bus.key_value import InvalidKey, KvConflict, KvEntry, KvOperation
from gfair.bus.topology import BucketSpec, Topology
from gfair.bus.transport import Bus, BusError
from support.waiting import eventually


async def bucket(bus: Bus, name: str = "jobs"):  # type: ignore[no-untyped-def]
    await bus.ensure_topology(Topology(buckets=(BucketSpec(name=name),)))
    return await bus.key_value(name)


async def test_put_get_and_revisions(bus: Bus) -> None:
    kv = await bucket(bus)
    assert await kv.get("j1") is None
    r1 = await kv.put("j1", b"queued")
    r2 = await kv.put("j2", b"queued")
    r3 = await kv.put("j1", b"running")
    assert r1 < r2 < r3
    entry = await kv.get("j1")
    assert entry is not None and (entry.value, entry.revision) == (b"running", r3)
    assert await kv.keys() == ["j1", "j2"]


async def test_create_and_update_are_compare_and_set(bus: Bus) -> None:
    kv = await bucket(bus)
    rev = await kv.create("pass.u1", b"0.25")
    with pytest.raises(KvConflict):
        await kv.create("pass.u1", b"0.5")
    rev2 = await kv.update("pass.u1", b"0.5", rev)
    with pytest.raises(KvConflict):
        await kv.update("pass.u1", b"0.75", rev)  # a writer holding a stale revision loses
    entry = await kv.get("pass.u1")
    assert entry is not None and (entry.value, entry.revision) == (b"0.5", rev2)


async def test_delete_hides_the_key_and_allows_recreate(bus: Bus) -> None:
    kv = await bucket(bus)
    rev = await kv.put("n1", b"up")
    with pytest.raises(KvConflict):
        await kv.delete("n1", revision=rev + 100)
    await kv.delete("n1", revision=rev)
    assert await kv.get("n1") is None
    assert await kv.keys() == []
    await kv.create("n1", b"back")
    entry = await kv.get("n1")
    assert entry is not None and entry.value == b"back"


async def test_entries_read_the_latest_value_of_every_key_in_one_go(bus: Bus) -> None:
    kv = await bucket(bus)
    await kv.put("job.b", b"1")
    second = await kv.put("job.a", b"2")
    await kv.put("gone", b"x")
    await kv.delete("gone")
    last = await kv.put("job.b", b"3")
    found = await kv.entries()
    assert [(e.key, e.value, e.revision) for e in found] == [
        ("job.a", b"2", second),
        ("job.b", b"3", last),
    ]


async def test_watch_sends_current_values_then_changes(bus: Bus) -> None:
    kv = await bucket(bus)
    await kv.put("a", b"1")
    await kv.put("b", b"2")
    await kv.delete("b")
    seen: list[KvEntry] = []
    async with await kv.watch() as watch:

        async def collect() -> None:
            async for entry in watch:
                seen.append(entry)
                if len(seen) == 3:
                    return

        collector = asyncio.create_task(collect())
        await eventually(lambda: len(seen) == 1)  # the current value came: it is watching
        await kv.put("c", b"3")
        await kv.delete("a")
        await asyncio.wait_for(collector, 5)
    assert [(e.key, e.value, e.operation) for e in seen] == [
        ("a", b"1", KvOperation.PUT),
        ("c", b"3", KvOperation.PUT),
        ("a", b"", KvOperation.DELETE),
    ]


async def test_watch_updates_only_and_by_pattern(bus: Bus) -> None:
    kv = await bucket(bus)
    await kv.put("node.n1", b"old")
    watch = await kv.watch("node.*", updates_only=True)
    await kv.put("job.j1", b"ignored")
    await kv.put("node.n2", b"new")
    entry = await asyncio.wait_for(anext(aiter(watch)), 5)
    assert (entry.key, entry.value) == ("node.n2", b"new")
    await watch.stop()


async def test_bad_keys_and_unknown_buckets_are_refused(bus: Bus) -> None:
    kv = await bucket(bus)
    with pytest.raises(InvalidKey):
        await kv.put("has space", b"x")
    with pytest.raises(InvalidKey):
        await kv.get(".leading")
    with pytest.raises(BusError, match="no key-value bucket"):
        await bus.key_value("missing")
