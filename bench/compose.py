"""Compose in a real Docker engine, beside the embedded cluster: the numbers users ask for.

Run, as root with a Docker engine: ``.venv/bin/python -m bench.compose [--latency-jobs 40]``

One run prints:

- the gfair image's size, and its build time from scratch (``--no-cache``) on the local bases
  of `deploy/images/build-local.sh`, from the wheelhouse;
- `docker compose up` of the broker, the services and one executor (4 simulated V100s) to the
  first job running;
- each container's memory (`docker stats`) at idle and with every GPU busy;
- submit -> running, one job at a time with GPUs free, through the engine (the operator's tool
  on the host, through the published broker port) and, as the baseline, on the embedded
  cluster of the same shape (`gfair up`'s processes, one server of 4 simulated V100s), both
  with a 60 s quantum and measured alike (`bench.live`).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import nats

from bench.compose_deployment import CONTROL_PLANE, build_images, connected, new_project
from bench.live import Timeline, measure_latency, percentiles
from gfair.bus.logs import configure_logging
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.publisher import EventPublisher
from gfair.core.kernel import DEFAULT_QUANTUM_S
from gfair.embedded_cluster import ClusterOptions, EmbeddedCluster

USER = "alice"  # a tenant of deploy/nats/tenants.toml
BUSY_JOB = ["/opt/gfair/bin/python", "-m", "gfair.sdk.synthetic", "--duration-s", "1000000"]


async def latency(url: str, user: str | None, password: str | None, jobs: int) -> list[float]:
    """Submit -> running on the cluster behind `url` (bench.live's method)."""
    connection = await nats.connect(url, user=user, password=password)
    timeline = Timeline()
    await connection.subscribe(f"gfair.submit.{USER}", cb=timeline.on_message)
    await connection.subscribe(f"gfair.job.{USER}.>", cb=timeline.on_message)
    await connection.subscribe("gfair.cmd.*.start", cb=timeline.on_message)
    bus = await NatsBus.connect(
        NatsOptions(servers=(url,), name="bench-compose", user=user, password=password)
    )
    try:
        return await measure_latency(
            EventPublisher(bus, "bench-compose"), timeline, jobs, 300, USER
        )
    finally:
        await bus.close()
        await connection.close()


def memory_table(label: str, memory: dict[str, float]) -> None:
    print(
        f"  {label}: "
        + ", ".join(f"{n.split('-', 2)[-1]} {m:.0f}" for n, m in sorted(memory.items()))
    )


async def main_async(args: argparse.Namespace) -> None:
    configure_logging("bench", level="WARNING", fmt="console")
    images = build_images(no_cache=True)
    print(f"image: {images.size_mb:.0f} MB, built from scratch in {images.build_s:.0f} s\n")
    with tempfile.TemporaryDirectory(prefix="gfair-bench-compose-") as work:
        project = new_project(images, Path(work), GFAIR_QUANTUM_S="60")
        try:
            started = time.monotonic()
            project.up("nats", *CONTROL_PLANE, "node-executor")
            login = project.login("operator", "GFAIR_OPERATOR_PASSWORD")
            async with await connected(login, project) as client:
                await client.submit(
                    USER, 1, ["true"], job_id="first", wait="running", timeout_s=120
                )
                print(f"docker compose up -> first job running: {time.monotonic() - started:.1f} s")
                await asyncio.sleep(10)  # let start-up settle before reading memory
                print("memory, MiB:")
                memory_table("idle", project.memory_mib())
                print("submit -> running through the engine, GPUs free:")
                url = login.servers[0]
                engine = await latency(url, "operator", login.password, args.latency_jobs)
                for n in range(4):
                    await client.submit(USER, 1, BUSY_JOB, job_id=f"busy-{n}", wait="running")
                await asyncio.sleep(10)
                memory_table("4 GPUs busy", project.memory_mib())
        finally:
            project.down(volumes=True)
    options = ClusterOptions(
        cluster="v100:1x4",
        quantum_s=DEFAULT_QUANTUM_S,
        data_dir=Path(tempfile.mkdtemp()),
        log_level="WARNING",
    )
    print("submit -> running on the embedded cluster, GPUs free:")
    async with EmbeddedCluster(options) as cluster:
        embedded = await latency(cluster.nats_url, None, None, args.latency_jobs)
    print("\nsubmit -> running, one job at a time, GPUs free, the two side by side:")
    print(f"  compose, in the engine   {percentiles(engine)}")
    print(f"  embedded cluster         {percentiles(embedded)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-jobs", type=int, default=40)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
