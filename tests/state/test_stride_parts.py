"""Split-stride's record stored in parts: a key per job and per server, a redo log per batch."""

from __future__ import annotations

from datetime import timedelta

import pytest
from bench.stride_store import T0, job, record

from gfair.bus.memory_kv import InMemoryKeyValue
from gfair.bus.topology import BucketSpec
from gfair.events.jobs import JobLaunch
from gfair.state.buckets import STRIDE
from gfair.state.stride_record import (
    STATE_KEY,
    StrideJob,
    StrideRecord,
    load_stride,
    save_stride,
)

NATS_DEFAULT_MAX_PAYLOAD = 1 << 20


class CutShort(InMemoryKeyValue):
    """A bucket whose writer dies at a chosen key: writes to it and after it never land."""

    def __init__(self, dies_at: str) -> None:
        super().__init__(BucketSpec(name=STRIDE.name))
        self.dies_at = dies_at
        self.dead = False

    def _dies(self, key: str) -> None:
        self.dead = self.dead or key.startswith(self.dies_at)
        if self.dead:
            raise ConnectionError("the writer died")

    async def put(self, key: str, value: bytes) -> int:
        self._dies(key)
        return await super().put(key, value)

    async def update(self, key: str, value: bytes, revision: int) -> int:
        self._dies(key)
        return await super().update(key, value, revision)

    async def delete(self, key: str, *, revision: int | None = None) -> None:
        self._dies(key)
        await super().delete(key, revision=revision)


def comparable(found: StrideRecord) -> dict[str, object]:
    return found.model_dump(exclude={"layout", "commit", "log_chunks"})


async def test_every_stored_value_stays_small_however_many_jobs() -> None:
    kv = InMemoryKeyValue(BucketSpec(name=STRIDE.name))
    many = record(4000)
    first = await save_stride(kv, many, None, None)
    sizes = [len(entry.value) for key in await kv.keys() if (entry := await kv.get(key))]
    assert max(sizes) < NATS_DEFAULT_MAX_PAYLOAD / 2
    assert first.record.log_chunks > 1  # the first write's log, all 4,000 jobs, in chunks
    loaded = await load_stride(kv)
    assert loaded is not None
    assert comparable(loaded.record) == comparable(many)
    assert StrideRecord.from_bytes((await kv.get(STATE_KEY)).value).jobs == {}  # type: ignore[union-attr]


async def test_a_batch_writes_only_the_jobs_it_changed() -> None:
    kv = InMemoryKeyValue(BucketSpec(name=STRIDE.name))
    before = record(20)
    first = await save_stride(kv, before, None, None)
    revisions = {key: (await kv.get(key)).revision for key in await kv.keys()}  # type: ignore[union-attr]
    jobs = dict(before.jobs)
    jobs[job(3).key] = job(3, stride_pass=2.5)
    del jobs[job(4).key]
    jobs[job(21).key] = job(21)
    after = before.model_copy(update={"jobs": jobs, "quantum": 5})
    await save_stride(kv, after, first.revision, first.record)
    now = {key: (await kv.get(key)).revision for key in await kv.keys()}  # type: ignore[union-attr]
    rewritten = {key for key in now if now[key] != revisions.get(key)}
    assert rewritten == {"state", "log.0", f"job.{job(3).key}", f"job.{job(21).key}"}
    assert f"job.{job(4).key}" not in now
    loaded = await load_stride(kv)
    assert loaded is not None and comparable(loaded.record) == comparable(after)


@pytest.mark.parametrize(
    ("dies_at", "kept"),
    [("log.", "before"), ("state", "before"), ("job.", "after"), ("server.", "after")],
)
async def test_a_write_cut_short_leaves_one_whole_record(dies_at: str, kept: str) -> None:
    kv = CutShort(dies_at="never")
    before = record(3000)
    first = await save_stride(kv, before, None, None)
    # Every job and a server change: the log runs to several chunks.
    servers = {
        k: s.model_copy(update={"changed_at": T0 + timedelta(1)}) for k, s in before.servers.items()
    }
    after = before.model_copy(
        update={
            "jobs": {k: j.model_copy(update={"stride_pass": 1.0}) for k, j in before.jobs.items()},
            "servers": servers,
            "quantum": 5,
        }
    )
    kv.dies_at = dies_at
    with pytest.raises(ConnectionError):
        await save_stride(kv, after, first.revision, first.record)
    loaded = await load_stride(kv)
    assert loaded is not None
    assert comparable(loaded.record) == comparable(before if kept == "before" else after)


async def test_a_shorter_log_deletes_the_chunks_left_of_a_longer_one() -> None:
    kv = InMemoryKeyValue(BucketSpec(name=STRIDE.name))
    many = record(4000)
    first = await save_stride(kv, many, None, None)
    assert first.record.log_chunks > 1
    after = many.model_copy(update={"quantum": 5})
    await save_stride(kv, after, first.revision, first.record)
    assert [key for key in await kv.keys() if key.startswith("log.")] == ["log.0"]


async def test_a_one_key_record_is_read_whole_and_stored_in_parts_at_its_next_write() -> None:
    kv = InMemoryKeyValue(BucketSpec(name=STRIDE.name))
    old = record(10)
    revision = await kv.create(STATE_KEY, old.to_bytes())  # as split-stride stored it before
    loaded = await load_stride(kv)
    assert loaded is not None and loaded.record.layout == 1
    assert comparable(loaded.record) == comparable(old)
    stored = await save_stride(kv, loaded.record, revision, loaded.record)
    assert sum(key.startswith("job.") for key in await kv.keys()) == 10
    again = await load_stride(kv)
    assert again is not None and again.record.layout == 2 and again.revision == stored.revision
    assert comparable(again.record) == comparable(old)


def test_a_job_stored_with_its_ids_inside_its_launch_keeps_them() -> None:
    """Records until 2026-12 kept the job's correlation id and trace inside its launch."""
    launch = {"command": ["true"], "env": {"A": "1"}, "working_dir": "/w"}
    old = {"user": "u", "job_id": "j", "gpus": 1, "weight": 1.0}
    ids = {"correlation_id": "c1", "trace_parent": "t1"}
    found = StrideJob.model_validate({**old, "launch": {**launch, **ids}})
    assert (found.correlation_id, found.trace_parent) == ("c1", "t1")
    assert found.launch == JobLaunch(command=("true",), env={"A": "1"}, working_dir="/w")
    assert StrideJob.model_validate_json(found.model_dump_json()) == found
