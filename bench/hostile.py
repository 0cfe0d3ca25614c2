"""A hostile tenant beside a well-behaved one on a live cluster (issue 23, "Tenants who attack").

Run: ``.venv/bin/python -m bench.hostile [--duration 180] [--quanta 3,6] [--queries 300]``

For each quantum, two runs of ``--duration`` seconds on ``v100:1x4,k80:1x4`` (simulated GPUs,
started as `gfair up` does), measured alike:

- **calm**: the well-behaved tenant (``bob``: two 1-GPU jobs) alone with a backlogged,
  well-behaved neighbour (``carol``: two 4-GPU gangs that yield when told);
- **hostile**: the same, but the neighbour (``alice``) runs whole-server gangs that ignore their
  yields (SIGUSR1 and SIGTERM trapped: only the kill at the end of their grace stops them) and
  floods the query service with ``--queries`` concurrent `gfair jobs`-style queries, each
  asking again as soon as it is answered.

The cluster requires logins (`gfair up --auth`, a tenants file of the three): the
neighbour's and bob's questions are a tenant's, answered by the query service; the
submissions and the accounting of bob's jobs are the operator's. Printed per run: bob's
received GPU share of the cluster over the window (GPU-seconds his jobs
held, from each start or resume report to the suspend or exit report) against his
entitlement (his 2 GPUs asked, of 8: the water-filled share, which both neighbours leave him),
and the latency of his own `jobs` query, asked every half second, p50 and p99.

Bob's jobs and the calm neighbour's are the SDK's synthetic training job, which yields at its
next mini-batch when told; what differs between the runs is the neighbour.
Everything shares this machine's cores: the numbers are what one box does.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.quanta import add_quanta_option
from gfair.bus.logs import configure_logging
from gfair.client import GfairClient
from gfair.client.connection import ConnectOptions
from gfair.client.switching import seconds_held
from gfair.embedded_cluster import ClusterOptions, EmbeddedCluster
from gfair.events.jobs import JobStarted

CLUSTER = "v100:1x4,k80:1x4"
TENANTS = ("alice", "bob", "carol")
CLUSTER_GPUS = 8
BOB_JOBS = 2
IGNORES_YIELDS = ["sh", "-c", 'trap "" USR1 TERM; sleep 1000000']
# The SDK's synthetic training job: it checkpoints and exits at its next mini-batch when told
# to yield, and resumes from there.
YIELDS = [sys.executable, "-m", "gfair.sdk.synthetic", "--duration-s", "1000000"]


@dataclass(frozen=True)
class Outcome:
    quantum_s: float
    hostile: bool
    share: float
    # Bob's share from his jobs' first start on (the mean over his jobs of how long after his
    # submission they first ran is `waited_s`)
    steady: float
    waited_s: float
    entitled: float
    p50_ms: float
    p99_ms: float
    queries: int


async def _flood(client: GfairClient, user: str, stop: asyncio.Event) -> int:
    answered = 0
    while not stop.is_set():
        try:
            await client.jobs(user)
            answered += 1
        except Exception:  # a refused or timed-out query is the flood's own business
            await asyncio.sleep(0.05)
    return answered


async def _probe(client: GfairClient, stop: asyncio.Event) -> list[float]:
    latencies: list[float] = []
    while not stop.is_set():
        began = time.perf_counter()
        await client.jobs("bob")
        latencies.append(time.perf_counter() - began)
        await asyncio.sleep(0.5)
    return latencies


async def _held(
    client: GfairClient, job_id: str, began: float, ended: float
) -> tuple[float, float]:
    """Seconds the job held its GPUs in [`began`, `ended`], and those since it first ran."""
    details = await client.job("bob", job_id)
    starts = [e.envelope.time.timestamp() for e in details.events if isinstance(e.data, JobStarted)]
    first = max(began, starts[0]) if starts else ended
    return seconds_held(details.events, began, ended), ended - first


def _login(cluster: EmbeddedCluster, user: str) -> ConnectOptions:
    assert cluster.logins is not None
    logins = {login.user: login for login in cluster.logins.tenant_logins}
    login = logins.get(user, cluster.logins.operator)
    return ConnectOptions(
        servers=(cluster.nats_url,), user=login.user, password=login.password, name=user
    )


async def run(quantum_s: float, hostile: bool, duration_s: float, queries: int) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="gfair-hostile-") as tmp:
        base = Path(tmp)
        for directory in (base, *base.parents[:1]):  # reachable by the tenants' own uids
            directory.chmod(directory.stat().st_mode | 0o001)
        tenants = base / "tenants.toml"
        tenants.write_text("".join(f'[[tenants]]\nname = "{t}"\n' for t in TENANTS))
        options = ClusterOptions(
            cluster=CLUSTER,
            quantum_s=quantum_s,
            data_dir=base / "gfair",
            log_level="WARNING",
            auth=tenants,
        )
        async with EmbeddedCluster(options) as cluster:
            neighbour = "alice" if hostile else "carol"
            operator = await GfairClient.connect(options=_login(cluster, "operator"))
            asker = await GfairClient.connect(options=_login(cluster, neighbour))
            bob = await GfairClient.connect(options=_login(cluster, "bob"))
            async with operator, asker, bob:
                command = IGNORES_YIELDS if hostile else YIELDS
                for index in range(2):
                    await operator.submit(neighbour, 4, command, job_id=f"gang{index}")
                await asyncio.sleep(2 * quantum_s)  # the gangs hold both servers
                for index in range(BOB_JOBS):
                    await operator.submit("bob", 1, YIELDS, job_id=f"b{index}")
                stop = asyncio.Event()
                # The neighbour's questions go through the query service, as a tenant's must.
                flood = [
                    asyncio.create_task(_flood(asker, neighbour, stop))
                    for _ in range(queries if hostile else 0)
                ]
                probe = asyncio.create_task(_probe(bob, stop))
                began = time.time()
                await asyncio.sleep(duration_s)
                ended = time.time()
                stop.set()
                latencies = await probe
                answered = sum(await asyncio.gather(*flood))
                runs = [await _held(operator, f"b{i}", began, ended) for i in range(BOB_JOBS)]
                held = sum(h for h, _ in runs)
                # Bob is owed from the tick after he submits: up to two quanta pass before his
                # jobs run, a wait the window counts against him and the steady state does not.
                since_first = sum(s for _, s in runs) / BOB_JOBS
    latencies.sort()
    return Outcome(
        quantum_s=quantum_s,
        hostile=hostile,
        share=held / (CLUSTER_GPUS * (ended - began)),
        steady=held / (CLUSTER_GPUS * since_first) if since_first > 0 else float("nan"),
        waited_s=(ended - began) - since_first,
        entitled=BOB_JOBS / CLUSTER_GPUS,
        p50_ms=1000 * statistics.median(latencies) if latencies else float("nan"),
        p99_ms=1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        if latencies
        else float("nan"),
        queries=answered,
    )


def _print(outcomes: list[Outcome]) -> None:
    print(
        f"{'quantum':>8} {'run':>8} {'bob share':>10} {'entitled':>9} {'ratio':>6} "
        f"{'waited':>7} {'from 1st run':>12} "
        f"{'jobs p50':>9} {'jobs p99':>9} {'flood answered':>15}"
    )
    for o in outcomes:
        print(
            f"{o.quantum_s:>7g}s {'hostile' if o.hostile else 'calm':>8} {o.share:>10.3f} "
            f"{o.entitled:>9.3f} {o.share / o.entitled:>6.2f} {o.waited_s:>6.1f}s "
            f"{o.steady / o.entitled:>12.2f} {o.p50_ms:>7.0f}ms "
            f"{o.p99_ms:>7.0f}ms {o.queries:>15}"
        )


async def _main(args: argparse.Namespace) -> int:
    outcomes = []
    for quantum in args.quanta:
        for hostile in (False, True):
            outcome = await run(quantum, hostile, args.duration, args.queries)
            outcomes.append(outcome)
            print(
                f"quantum {quantum:g}s {'hostile' if hostile else 'calm'}: "
                f"bob {outcome.share:.3f} of {outcome.entitled:.3f}",
                flush=True,
            )
    _print(outcomes)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__)
    parser.add_argument("--duration", type=float, default=180.0, help="seconds per run")
    add_quanta_option(parser)
    parser.add_argument("--queries", type=int, default=300, help="hostile queries in flight")
    args = parser.parse_args(argv)
    configure_logging("bench.hostile", level="WARNING")
    return asyncio.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())
