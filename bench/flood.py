"""A job that floods its node with progress lines and output (issue 41, "progress spam drowns
the node"): the executor's event loop stays on time and its memory bounded.

Run: ``.venv/bin/python -m bench.flood [--seconds 20] [--tick-s 1.0]``

Per variant, in a process of its own (the executor's part: a `JobSupervisor` reading the job's
progress as the node executor's does, and the `OutputShipper` shipping its stdout to an
in-memory bus every second, capped as `gfair up` caps it), one job runs for `--seconds`:

- **quiet** (the baseline): a step line every 0.2 s (as the SDK writes) and a line of stdout a
  second;
- **flood**: progress lines and stdout written flat out, a malformed and an overflowing line
  among them.

A ticker in the same event loop stands for the heartbeat (every `--tick-s`); printed: the
largest gap between two of its ticks (target: at most twice `--tick-s`), the process's peak
resident memory (target: under 500 MB), what the job wrote and what the reader skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from gfair.bus.job_output import job_output_stream
from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.topology import Topology
from gfair.events.fields import JobRef
from gfair.node.job_account import derived_account
from gfair.node.job_disk import OUTPUT_MAX_BYTES
from gfair.node.job_runner import SupervisorConfig
from gfair.node.launch import RunSpec
from gfair.node.supervisor import JobSupervisor
from gfair_services.node_executor.output_shipper import OutputShipper
from gfair_services.node_executor.settings import NodeExecutorSettings

# As root the job runs as another account, which may not reach a virtual environment's Python.
JOB_PYTHON = "/usr/bin/python3" if os.geteuid() == 0 else sys.executable
JOBS = {
    "quiet": (
        "import json, os, sys, time\n"
        "path = os.path.join(os.environ['GFAIR_CONTROL_DIR'], 'progress.jsonl')\n"
        "end, step = time.time() + float(sys.argv[1]), 0\n"
        "with open(path, 'a') as out:\n"
        "    while time.time() < end:\n"
        "        step += 1\n"
        "        record = {'kind': 'step', 'time': time.time(), 'step': step}\n"
        "        out.write(json.dumps(record) + '\\n')\n"
        "        out.flush()\n"
        "        if step % 5 == 0:\n"
        "            print('step', step, flush=True)\n"
        "        time.sleep(0.2)\n"
    ),
    "flood": (
        "import os, sys, time\n"
        "path = os.path.join(os.environ['GFAIR_CONTROL_DIR'], 'progress.jsonl')\n"
        "end, step = time.time() + float(sys.argv[1]), 0\n"
        "noise = b'x' * 65536\n"
        "with open(path, 'ab', buffering=1 << 20) as out:\n"
        "    out.write(b'{\"kind\":\"step\",\"time\":1' + b'0' * 400 + b'}\\nnot json\\n')\n"
        "    while time.time() < end:\n"
        "        now = time.time()\n"
        "        for _ in range(1000):\n"
        "            step += 1\n"
        '            out.write(b\'{"kind":"step","time":%f,"step":%d}\\n\' % (now, step))\n'
        "        sys.stdout.buffer.write(noise)\n"
    ),
}


async def run_variant(variant: str, seconds: float, tick_s: float, root: Path) -> dict[str, float]:
    account = derived_account("bench-flood") if os.geteuid() == 0 else None
    # The node executor's caps (its settings' defaults): output files, the whole run directory.
    config = SupervisorConfig(
        node_id="bench",
        run_root=root / "runs",
        checkpoint_root=root / "ckpt",
        account=account,
        output_max_bytes=OUTPUT_MAX_BYTES,
        disk_max_bytes=NodeExecutorSettings().job_disk_max_bytes,
    )
    bus = InMemoryBus()
    await bus.ensure_topology(Topology(streams=(job_output_stream(),)))
    job = JobRef(user="bench", job_id="flood")

    @dataclasses.dataclass
    class Run:
        job: JobRef
        running: bool
        start_event_id: str

    table = [Run(job, True, "start-1")]
    # The shipper looks for <runs>/<user>/<job>: the supervisor's run root is the user's.
    shipper = OutputShipper(bus, "bench", root, root / "shipped", lambda: table)
    gaps: list[float] = []
    async with JobSupervisor(dataclasses.replace(config, run_root=root / "bench")) as supervisor:
        shipper.start()
        launch = RunSpec(
            job_id="flood",
            argv=(JOB_PYTHON, "-c", JOBS[variant], str(seconds)),
            gpu_indices=(0,),
            generation="v100",
        )
        handle = await supervisor.start(launch)
        tail = supervisor._jobs["flood"].tail  # what its reader skipped, read at the end
        last = time.monotonic()
        deadline = last + seconds + 1
        while time.monotonic() < deadline:
            await asyncio.sleep(tick_s)
            now = time.monotonic()
            gaps.append(now - last)
            last = now
        with anyio.fail_after(60):
            exited = await supervisor.wait("flood")
        await shipper.stop()
    counts = (tail.malformed, tail.dropped, tail.skipped_bytes)
    stdout = handle.paths.stdout.stat().st_size
    progress = handle.paths.control_dir.joinpath("progress.jsonl").stat().st_size
    return {
        "max_gap_s": max(gaps),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "progress_mb": progress / 1e6,
        "stdout_kept_mb": stdout / 1e6,
        "malformed": counts[0],
        "dropped": counts[1],
        "skipped_mb": counts[2] / 1e6,
        "steps": exited.steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--tick-s", type=float, default=1.0)
    parser.add_argument("--variant", choices=sorted(JOBS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        root = Path(tempfile.mkdtemp(prefix="gfair-flood-"))
        root.chmod(0o711)
        try:
            result = asyncio.run(run_variant(args.variant, args.seconds, args.tick_s, root))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(json.dumps(result))
        return
    print(f"one job for {args.seconds:g} s, a heartbeat tick every {args.tick_s:g} s")
    print(
        f"{'':6} {'max gap s':>9} {'peak RSS MB':>11} {'progress MB':>11} "
        f"{'stdout kept MB':>14} {'malformed':>9} {'dropped':>8} {'skipped MB':>10} {'steps':>9}"
    )
    for variant in ("quiet", "flood"):
        # A process each: the peak memory is the variant's own.
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.flood",
                "--variant",
                variant,
                "--seconds",
                str(args.seconds),
                "--tick-s",
                str(args.tick_s),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(
            f"{variant:6} {r['max_gap_s']:9.2f} {r['peak_rss_mb']:11.0f} {r['progress_mb']:11.0f} "
            f"{r['stdout_kept_mb']:14.1f} {r['malformed']:9d} {r['dropped']:8d} "
            f"{r['skipped_mb']:10.0f} {r['steps']:9d}"
        )


if __name__ == "__main__":
    main()
