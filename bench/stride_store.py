"""Split-stride's stored record (`gfair_stride`) at scale: one key holding every job (before)
against a key per job and per server (after, `gfair.state.stride_record`), on a real broker.

Run: ``.venv/bin/python -m bench.stride_store [--jobs 2000 20000] [--batches 5]``

Starts its own nats-server (JetStream, file storage, messages up to 64 MiB so that the one-key
record can be stored at all past ~2,000 jobs) and, for each job count, a record of that many
jobs (~520 bytes each, as split-stride holds them: a residency, a placement) on a server per 20
jobs. Both layouts are stored once, then measured per batch of events that changed `--changed`
jobs (a batch of reports between ticks), and per tick that changed every job's pass (the worst
batch): wall time to serialize and store (median of `--batches`), bytes sent, and the largest
single message; then the time a restarted split-stride takes to read the record back.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gfair.bus.key_value import KeyValue, KvEntry
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.server import EmbeddedNatsServer, NatsServerConfig
from gfair.bus.topology import BucketSpec, Topology
from gfair.state.buckets import STRIDE
from gfair.state.stride_record import (
    STATE_KEY,
    Residency,
    ResidencyPhase,
    ServerRecord,
    StrideJob,
    StrideRecord,
    load_stride,
    save_stride,
)

T0 = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
MAX_PAYLOAD = 64 << 20


@dataclass
class Measured:
    batch_ms: float
    batch_bytes: int
    tick_ms: float
    tick_bytes: int
    largest: int
    read_ms: float


class Counting:
    """A bucket that counts what is written through it."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv
        self.bytes = 0
        self.largest = 0

    def _count(self, value: bytes) -> None:
        self.bytes += len(value)
        self.largest = max(self.largest, len(value))

    async def get(self, key: str) -> KvEntry | None:
        return await self.kv.get(key)

    async def keys(self) -> list[str]:
        return await self.kv.keys()

    async def entries(self) -> list[KvEntry]:
        return await self.kv.entries()

    async def put(self, key: str, value: bytes) -> int:
        self._count(value)
        return await self.kv.put(key, value)

    async def create(self, key: str, value: bytes) -> int:
        self._count(value)
        return await self.kv.create(key, value)

    async def update(self, key: str, value: bytes, revision: int) -> int:
        self._count(value)
        return await self.kv.update(key, value, revision)

    async def delete(self, key: str, *, revision: int | None = None) -> None:
        await self.kv.delete(key, revision=revision)


def job(n: int, stride_pass: float = 0.0) -> StrideJob:
    node = f"v100-{n // 20}"
    return StrideJob(
        user=f"user{n % 100:03d}",
        job_id=f"job-{n:06d}",
        gpus=1,
        weight=1.0,
        job_type="resnet50",
        seq=n,
        stride_pass=stride_pass,
        generation="v100",
        servers=(node,),
        residency=(
            Residency(
                node_id=node,
                phase=ResidencyPhase.RUNNING,
                attempt=1,
                gpu_indices=(n % 8,),
                since=T0,
                quantum=3,
            ),
        ),
    )


def record(jobs: int) -> StrideRecord:
    return StrideRecord(
        epoch="bench",
        quantum=3,
        usage_since=T0,
        updated_at=T0,
        servers={
            f"v100-{n}": ServerRecord(
                node_id=f"v100-{n}", generation="v100", gpu_indices=tuple(range(8)), changed_at=T0
            )
            for n in range(max(jobs // 20, 1))
        },
        jobs={j.key: j for j in (job(n) for n in range(jobs))},
        usage={f"user{u:03d}": {"v100": 1000.0 + u} for u in range(100)},
    )


def changed(base: StrideRecord, batch: int, count: int, pass_: float) -> StrideRecord:
    """`base` with `count` jobs' passes moved (the batch's changes), the quantum on."""
    jobs = dict(base.jobs)
    keys = list(jobs)
    for index in range(count):
        key = keys[(batch * count + index) % len(keys)]
        jobs[key] = jobs[key].model_copy(update={"stride_pass": pass_ + index})
    return base.model_copy(update={"jobs": jobs, "quantum": base.quantum + 1})


async def one_key(kv: Counting, base: StrideRecord, args: argparse.Namespace) -> Measured:
    """As split-stride stored it before: the whole record, every job in it, in key ``state``."""
    revision = await kv.create(STATE_KEY, base.to_bytes())
    current = base

    async def write(record: StrideRecord) -> None:
        nonlocal revision, current
        revision = await kv.update(STATE_KEY, record.to_bytes(), revision)
        current = record

    return await measured(kv, base, write, lambda: current, args)


async def measured(
    kv: Counting,
    base: StrideRecord,
    write: Callable[[StrideRecord], Awaitable[None]],
    current: Callable[[], StrideRecord],
    args: argparse.Namespace,
) -> Measured:
    """Batches that change `--changed` jobs, then a tick that changes them all, then a read."""
    kv.bytes = 0
    batch_ms = []
    for batch in range(args.batches):
        next_record = changed(current(), batch, args.changed, batch)
        began = time.perf_counter()
        await write(next_record)
        batch_ms.append((time.perf_counter() - began) * 1000)
    batch_bytes, kv.bytes = kv.bytes // args.batches, 0
    tick = changed(current(), 0, len(base.jobs), 0.5)
    began = time.perf_counter()
    await write(tick)
    tick_ms = (time.perf_counter() - began) * 1000
    began = time.perf_counter()
    loaded = await load_stride(kv)
    read_ms = (time.perf_counter() - began) * 1000
    assert loaded is not None and len(loaded.record.jobs) == len(base.jobs)
    return Measured(
        statistics.median(batch_ms), batch_bytes, tick_ms, kv.bytes, kv.largest, read_ms
    )


async def in_parts(kv: Counting, base: StrideRecord, args: argparse.Namespace) -> Measured:
    stored = await save_stride(kv, base, None, None)
    current = base

    async def write(record: StrideRecord) -> None:
        nonlocal stored, current
        stored = await save_stride(kv, record, stored.revision, stored.record)
        current = record

    return await measured(kv, base, write, lambda: current, args)


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="gfair-stride-store-") as tmp:
        server = EmbeddedNatsServer(
            NatsServerConfig(store_dir=Path(tmp) / "nats", max_payload=MAX_PAYLOAD)
        )
        server.start()
        try:
            bus = await NatsBus.connect(NatsOptions(servers=(server.url,)))
            try:
                print(
                    f"{'jobs':>6} {'layout':<8} {'batch ms':>9} {'batch KiB':>10} "
                    f"{'tick ms':>8} {'tick KiB':>9} {'largest KiB':>12} {'read ms':>8}"
                )
                for count in args.jobs:
                    base = record(count)
                    for name, how in (("one key", one_key), ("per job", in_parts)):
                        bucket = BucketSpec(name=f"{STRIDE.name}_{count}_{name[:3]}")
                        await bus.ensure_topology(Topology(buckets=(bucket,)))
                        kv = Counting(await bus.key_value(bucket.name))
                        found = await how(kv, base, args)
                        print(
                            f"{count:>6} {name:<8} {found.batch_ms:>9.1f} "
                            f"{found.batch_bytes / 1024:>10.1f} {found.tick_ms:>8.0f} "
                            f"{found.tick_bytes / 1024:>9.0f} {found.largest / 1024:>12.0f} "
                            f"{found.read_ms:>8.0f}",
                            flush=True,
                        )
            finally:
                await bus.close()
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--batches", type=int, default=5, help="batches measured per layout")
    parser.add_argument("--changed", type=int, default=10, help="jobs a batch of events changes")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
