"""A tenant's job that attacks its node through its progress file and its output (issue 41,
items 5 and 7): the node reads a bounded amount, reports the job's exit whatever it wrote, and
stops on SIGTERM while such a job runs."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import anyio
import pytest

from gfair.bus.server import EmbeddedNatsServer
from gfair.events.nodes import NodeRegistered
from gfair.node.job_disk import capped_note
from gfair.node.progress import ProgressLimits
from gfair.node.simulated import SimulatedGpus
from gfair.node.supervisor import JobSupervisor
from gfair_services.topology import cluster_topology
from node.helpers import (
    JOB_PYTHON,
    make_config,
    python_job,
    reachable_tmp,
    sdk_on_pythonpath,
)
from services.test_node_executor import Node, executor_process, nats_bus, start_command

tmp_path = pytest.fixture(name="tmp_path")(reachable_tmp)
sdk_for_jobs = pytest.fixture(autouse=True)(sdk_on_pythonpath)

# Writes a step whose time no float holds, then an honest one, then ends on its own.
OVERFLOWING = (
    "import os, time\n"
    "with open(os.environ['GFAIR_CONTROL_DIR'] + '/progress.jsonl', 'a') as out:\n"
    '    out.write(\'{"kind":"step","time":1\' + \'0\' * 400 + \',"step":1}\\n\')\n'
    "    out.flush()\n"
    "    time.sleep(0.5)\n"
    '    out.write(\'{"kind":"step","time":%f,"step":2}\\n\' % time.time())\n'
    "time.sleep(0.5)\n"
)
# The same line, then progress lines flat out, deaf to SIGTERM.
FLOODING = (
    "import os, signal\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "out = open(os.environ['GFAIR_CONTROL_DIR'] + '/progress.jsonl', 'a')\n"
    'out.write(\'{"kind":"step","time":1\' + \'0\' * 400 + \',"step":1}\\n\')\n'
    'line = \'{"kind":"step","time":1.0,"step":3}\\n\' * 1000\n'
    "while True:\n"
    "    out.write(line)\n"
)


async def test_a_progress_line_that_overflows_leaves_no_phantom_job(tmp_path: Path) -> None:
    async with JobSupervisor(make_config(tmp_path)) as supervisor:
        await supervisor.start(python_job("overflow", OVERFLOWING))
        with anyio.fail_after(20):
            exited = await supervisor.wait("overflow")
        # It ran to its own end, its exit reported, its GPU free.
        assert exited.exit_code == 0 and exited.signal is None, exited.stderr_tail
        assert exited.steps == 2
        assert supervisor.running() == [] and supervisor.busy_gpus() == frozenset()


@pytest.mark.nats
async def test_the_executor_stops_on_sigterm_while_a_job_floods_its_progress(
    nats_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    process = executor_process(
        nats_server,
        tmp_path,
        "--suspend-timeout-s",
        "1",
        "--term-grace-s",
        "1",
        stderr=subprocess.DEVNULL,
    )
    bus = await nats_bus(nats_server)
    try:
        await bus.ensure_topology(cluster_topology())
        node = Node(bus, executor=None, gpus=SimulatedGpus("v100:2"))  # type: ignore[arg-type]
        await node.wait_for(NodeRegistered, timeout_s=30.0)
        await node.send(start_command(tmp_path, "flood", (JOB_PYTHON, "-c", FLOODING), (0,)))
        progress = work / "runs" / "alice" / "flood"
        for _ in range(300):  # until it wrote a megabyte of progress
            if any(p.stat().st_size > 1 << 20 for p in progress.glob("*/control/*.jsonl")):
                break
            await anyio.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(process.wait, 30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        await bus.close()


async def test_a_flood_of_output_and_progress_stays_within_its_caps_on_disk(
    tmp_path: Path,
) -> None:
    """The second red-team pass: stdout.log reached 27 GB between two shipping passes, and the
    progress file 14 GB in a minute; the supervisor now cuts both back as the job writes."""
    flood = (
        "import os, sys, time\n"
        "progress = open(os.environ['GFAIR_CONTROL_DIR'] + '/progress.jsonl', 'a')\n"
        'line = \'{"kind":"step","time":1.0,"step":3}\\n\' * 1000\n'
        "block = b'y' * (1 << 20)\n"
        "end = time.monotonic() + 3\n"
        "while time.monotonic() < end:\n"
        "    sys.stdout.buffer.write(block)\n"
        "    progress.write(line)\n"
    )
    limits = ProgressLimits(file_bytes=1 << 20)
    config = make_config(tmp_path, output_max_bytes=1 << 20, progress_limits=limits)
    async with JobSupervisor(config) as supervisor:
        job = await supervisor.start(python_job("flood", flood))
        exited = await supervisor.wait("flood")
    assert exited.exit_code == 0, exited.stderr_tail
    stdout = job.paths.stdout.read_bytes()
    note = capped_note("stdout", 1 << 20)
    assert len(stdout) == (1 << 20) + len(note) and stdout.endswith(note)
    progress = job.paths.control_dir / "progress.jsonl"
    # The last read emptied it past twice its cap; what was written after stays under that.
    assert progress.stat().st_size <= 2 * limits.file_bytes + 64 * 1024
