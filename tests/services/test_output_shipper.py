"""The node executor's output shipper on a real nats-server: what runs write to stdout and
stderr ends up in GFAIR_LOGS, once, in order, across passes, chunks, runs and restarts."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gfair.bus.job_output import (
    DEFAULT_MAX_MSGS_PER_SUBJECT,
    LOGS_STREAM,
    OutputChunk,
    job_output_stream,
    output_subject,
    publish_chunk,
    read_output,
)
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.topology import Topology
from gfair.events.fields import JobRef
from gfair.node.job_disk import capped_note
from gfair.node.run_directory import TOLD_RECORD
from gfair_services.node_executor.output_shipper import OutputShipper
from gfair_services.topology import cluster_topology

pytestmark = pytest.mark.nats

JOB = JobRef(user="alice", job_id="train-1")


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[NatsBus]:
    connected = await NatsBus.connect(NatsOptions(servers=(nats_url,), name="test-shipper"))
    await connected.ensure_topology(Topology(streams=(job_output_stream(),)))
    try:
        yield connected
    finally:
        await connected.close()


@dataclass
class Started:
    """The executor's latest run of the job, as its run table holds it."""

    job: JobRef
    running: bool
    start_event_id: str


class Node:
    """A node's run directories, and the runs its executor's table holds."""

    def __init__(self, root: Path) -> None:
        self.runs = root / "runs"
        self.records = root / "shipped"
        self.table: list[Started] = []

    def run(self, number: int, *, running: bool = True) -> Path:
        """Start run `number` of the job (its directory first, as the supervisor does)."""
        path = self.runs / JOB.user / JOB.job_id / f"run-{number:04d}"
        path.mkdir(parents=True, exist_ok=True)
        self.table = [Started(JOB, running, f"start-{number}")]
        return path

    def job_ended(self) -> None:
        self.table = [Started(JOB, False, s.start_event_id) for s in self.table]

    def shipper(self, bus: NatsBus, chunk_bytes: int = 65536, **caps: int) -> OutputShipper:
        return OutputShipper(
            bus,
            "v100-0",
            self.runs,
            self.records,
            lambda: self.table,
            chunk_bytes=chunk_bytes,
            **caps,
        )


def append(path: Path, text: str) -> None:
    with path.open("a") as stream:
        stream.write(text)


async def stored(bus: NatsBus) -> list[OutputChunk]:
    return [c async for c in read_output(bus, JOB.user, JOB.job_id)]


def text(chunks: list[OutputChunk], run: str, output: str) -> str:
    """The file as rebuilt from its chunks, each at its offset (a gap or overlap fails)."""
    rebuilt = b""
    for chunk in chunks:
        if chunk.run == run and chunk.output == output and not chunk.end:
            assert chunk.offset == len(rebuilt), "chunks out of order, lost or repeated"
            rebuilt += chunk.data
    return rebuilt.decode()


async def test_output_is_shipped_in_order_across_passes_and_chunks(
    bus: NatsBus, tmp_path: Path
) -> None:
    node = Node(tmp_path)
    run = node.run(1)
    shipper = node.shipper(bus, chunk_bytes=4)
    append(run / "stdout.log", "epoch 1 loss 0.9\n")
    assert await shipper.ship() == 17
    append(run / "stdout.log", "epoch 2 loss 0.5\n")
    append(run / "stderr.log", "warning: slow\n")
    assert await shipper.ship() == 17 + 14
    assert await shipper.ship() == 0  # nothing new; still running, so not closed
    chunks = await stored(bus)
    assert text(chunks, "run-0001", "stdout") == "epoch 1 loss 0.9\nepoch 2 loss 0.5\n"
    assert text(chunks, "run-0001", "stderr") == "warning: slow\n"
    assert all(len(c.data) <= 4 for c in chunks)
    assert not any(c.end for c in chunks)
    assert {(c.node, c.run) for c in chunks} == {("v100-0", "run-0001")}


async def test_a_run_that_ended_is_closed_and_a_restart_goes_on_where_it_stopped(
    bus: NatsBus, tmp_path: Path
) -> None:
    node = Node(tmp_path)
    first = node.run(1)
    append(first / "stdout.log", "step 1\n")
    assert await node.shipper(bus).ship() == 7
    # Suspended, then resumed here: a new run directory; the executor restarted meanwhile.
    append(first / "stdout.log", "yielding at step 2\n")
    second = node.run(2)
    append(second / "stdout.log", "resumed at step 2\n")
    restarted = node.shipper(bus)
    restarted.start()  # follows the run left unfinished
    await restarted.stop()  # its last pass: the rest of run 1, all of run 2
    chunks = await stored(bus)
    assert text(chunks, "run-0001", "stdout") == "step 1\nyielding at step 2\n"
    assert text(chunks, "run-0002", "stdout") == "resumed at step 2\n"
    # Run 1 had nothing more on a later pass and is not the newest: closed; run 2 runs on.
    again = node.shipper(bus)
    again.start()
    await again.stop()
    node.job_ended()
    ended = node.shipper(bus)
    ended.start()
    assert await ended.ship() == 0
    await ended.stop()
    chunks = await stored(bus)
    ends = {(c.run, c.output) for c in chunks if c.end}
    assert ends == {(r, o) for r in ("run-0001", "run-0002") for o in ("stdout", "stderr")}
    # Nothing was stored twice, however many shippers passed over the same files.
    data = [(c.run, c.output, c.offset) for c in chunks if not c.end]
    assert len(data) == len(set(data))


async def test_a_job_that_started_and_ended_between_two_passes_is_shipped(
    bus: NatsBus, tmp_path: Path
) -> None:
    node = Node(tmp_path)
    shipper = node.shipper(bus)
    assert await shipper.ship() == 0  # nothing started yet
    run = node.run(1, running=False)  # started, wrote, exited: never seen running
    append(run / "stdout.log", "synthetic job: completed 10 steps\n")
    assert await shipper.ship() == 34
    assert await shipper.ship() == 0  # complete: closed
    chunks = await stored(bus)
    assert text(chunks, "run-0001", "stdout") == "synthetic job: completed 10 steps\n"
    assert {c.output for c in chunks if c.end} == {"stdout", "stderr"}


async def test_output_stored_before_the_node_joined_its_subject_is_still_read(
    bus: NatsBus,
) -> None:
    # Until 2026-11-25 a chunk's subject ended with the output, and a header named the node.
    legacy = {"Gfair-Node": "v100-0", "Gfair-Run": "run-0001", "Gfair-Offset": "0"}
    await bus.publish("gfair.logs.alice.train-1.stdout", b"old\n", headers=legacy)
    later = OutputChunk(output="stdout", node="v100-0", run="run-0001", offset=4, data=b"new\n")
    await publish_chunk(bus, JOB.user, JOB.job_id, later)
    chunks = await stored(bus)
    assert [(c.node, c.offset, c.data) for c in chunks] == [
        ("v100-0", 0, b"old\n"),
        ("v100-0", 4, b"new\n"),
    ]


async def test_a_flood_of_output_is_cut_at_its_cap_and_shipped_in_bounded_passes(
    bus: NatsBus, tmp_path: Path
) -> None:
    # Issue 41: one job's gigabyte of stdout was kept whole on the node and in GFAIR_LOGS.
    node = Node(tmp_path)
    run = node.run(1)
    shipper = node.shipper(bus, chunk_bytes=1000, max_bytes=10_000, pass_bytes=4000)
    append(run / "stdout.log", "x" * 1_000_000)
    note = capped_note("stdout", 10_000)
    assert await shipper.ship() == 4000  # a pass ships at most its share
    # The file is cut back to the cap and the note that says so, on the node too.
    assert (run / "stdout.log").read_bytes() == b"x" * 10_000 + note
    append(run / "stdout.log", "y" * 1_000_000)  # the job goes on writing
    while await shipper.ship():
        pass
    assert (run / "stdout.log").stat().st_size == 10_000 + len(note)
    assert text(await stored(bus), "run-0001", "stdout") == "x" * 10_000 + note.decode()


def test_the_logs_stream_keeps_each_jobs_output_apart() -> None:
    (logs,) = [s for s in cluster_topology().streams if s.name == LOGS_STREAM]
    # A subject is one job's one output from one node: its flood evicts only its own chunks.
    assert logs.max_msgs_per_subject == DEFAULT_MAX_MSGS_PER_SUBJECT
    assert output_subject("a", "j", "stdout", "n") == "gfair.logs.a.j.stdout.n"


async def test_runs_of_jobs_gone_past_their_retention_are_removed_and_no_other(
    bus: NatsBus, tmp_path: Path
) -> None:
    """Issue 41: run directories (and a job's default working directory) were never cleaned."""
    node = Node(tmp_path)
    run = node.run(1)
    append(run / "stdout.log", "done\n")
    (run.parent / "work").mkdir()
    (run.parent / "work" / "scratch").write_bytes(b"x" * 1024)
    node.job_ended()
    now = 1_000_000.0
    shipper = node.shipper(bus)
    assert await shipper.ship() == 5
    await shipper.ship()  # nothing new: the run's output is complete, its end shipped
    # Its end not yet told to the scheduler: kept (a restarted executor still reports it).
    assert shipper.sweep(now, set()) == []
    (run / TOLD_RECORD).write_text("{}")
    os.utime(run / TOLD_RECORD, (now - 10, now - 10))
    # Told, but within the retention, or the job runs here again: kept.
    assert shipper.sweep(now - 20, set()) == []
    assert shipper.sweep(now, {JOB}) == []
    assert run.is_dir()
    assert shipper.sweep(now, set()) == [JOB]
    assert not run.parent.exists()
    assert not list(node.records.rglob("*.json"))


async def test_the_sweep_runs_once_an_hour_from_the_shippers_own_passes(
    bus: NatsBus, tmp_path: Path
) -> None:
    node = Node(tmp_path)
    run = node.run(1)
    node.job_ended()
    clock = [5_000.0]
    shipper = OutputShipper(
        bus, "v100-0", node.runs, node.records, lambda: node.table, retention_s=60.0,
        clock=lambda: clock[0],
    )  # fmt: skip
    await shipper.ship()
    await shipper.ship()  # closes the run
    (run / TOLD_RECORD).write_text("{}")
    os.utime(run / TOLD_RECORD, (clock[0] - 120, clock[0] - 120))
    clock[0] += 60
    await shipper.ship()  # the first pass swept already, an hour has not gone by
    assert run.is_dir()
    clock[0] += 3600
    await shipper.ship()
    assert not run.parent.exists()
