"""What an idle cluster of virtual servers costs, before any job: its fixed load.

Run: ``.venv/bin/python -m bench.idle [--servers 1000] [--seconds 40] [--heartbeat 5]
[--baseline GFAIR_COMMAND_WAIT_S=1]``.

A whole cluster as `gfair up --virtual` starts it (embedded nats-server, the scheduler
services, the query service, one virtual-nodes process per 100 servers), no job submitted: per
process, the cores it uses over ``--seconds`` after a settling wait. Run twice in one go: with
the ``--baseline`` settings (by default a node's pull for commands waiting 1 s at the broker, as
it did before `GFAIR_COMMAND_WAIT_S`) and with the defaults. Whatever an idle cluster costs
(heartbeats, telemetry, pulls for commands, the services reading them) every busy one pays too,
before its first job.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from bench.live import brokers_of, cpu_seconds
from bench.scale import cluster_spec
from gfair.core.kernel import DEFAULT_QUANTUM_S
from gfair.embedded_cluster import ClusterOptions, EmbeddedCluster

SETTLE_S = 15.0


async def measure(
    servers: int, seconds: float, heartbeat_s: float, env: dict[str, str]
) -> dict[str, float]:
    """Cores per process group (the virtual-nodes processes summed) of an idle cluster."""
    with tempfile.TemporaryDirectory(prefix="gfair-idle-") as tmp:
        os.chmod(tmp, 0o711)  # an executor running as root wants its roots open to passage
        options = ClusterOptions(
            cluster=cluster_spec(servers),
            quantum_s=DEFAULT_QUANTUM_S,
            data_dir=Path(tmp) / "gfair",
            virtual=True,
            log_level="WARNING",
            ready_timeout_s=600.0,
            heartbeat_s=heartbeat_s,
            env=env,
        )
        async with EmbeddedCluster(options) as cluster:
            await asyncio.sleep(SETTLE_S)  # registrations, consumers declared, first pulls
            pids = {name: child.pid for name, child in cluster.children.items()}
            pids.update(brokers_of(os.getpid()))
            before, began = cpu_seconds(pids), time.monotonic()
            await asyncio.sleep(seconds)
            after, elapsed = cpu_seconds(pids), time.monotonic() - began
    cores: dict[str, float] = {}
    for name, used in after.items():
        group = "virtual-nodes" if name.startswith("virtual-nodes") else name
        cores[group] = cores.get(group, 0.0) + (used - before.get(name, used)) / elapsed
    return cores


def report(
    servers: int, baseline: dict[str, str], runs: list[dict[str, float]], out: TextIO
) -> None:
    names = sorted(set(runs[0]) | set(runs[1]), key=lambda n: -runs[1].get(n, 0.0))
    label = " ".join(f"{k}={v}" for k, v in baseline.items()) or "baseline"
    print(f"| {servers:,} idle virtual servers, cores | {label} | defaults |", file=out)
    print("|---|---|---|", file=out)
    for name in names:
        cells = [f"{run.get(name, 0.0):.3f}" for run in runs]
        print(f"| {name} | {cells[0]} | {cells[1]} |", file=out)
    totals = [f"{sum(run.values()):.3f}" for run in runs]
    print(f"| all | {totals[0]} | {totals[1]} |", file=out)


async def main_async(args: argparse.Namespace) -> None:
    baseline = dict(item.split("=", 1) for item in args.baseline)
    runs = []
    for env in (baseline, {}):
        print(f"... {args.servers:,} idle virtual servers, {env or 'defaults'}", flush=True)
        runs.append(await measure(args.servers, args.seconds, args.heartbeat, env))
    report(args.servers, baseline, runs, sys.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--heartbeat", type=float, default=5.0)
    parser.add_argument(
        "--baseline",
        nargs="*",
        default=["GFAIR_COMMAND_WAIT_S=1"],
        metavar="NAME=VALUE",
        help="settings of the baseline run (the other runs with the defaults)",
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
