"""Live fairness: what each user receives on a live cluster against its entitlement, beside the
simulator's prediction for the same workload (issue 10).

Run: ``.venv/bin/python -m bench.fairness [--cluster v100:1x4,k80:1x4] [--quantum 6]
[--quanta 20] [--warmup-quanta 3] [--no-trading] [--shares FILE]``

Starts a whole cluster as `gfair up` does (embedded nats-server, the scheduler services, one
node executor per server, simulated GPUs), submits a backlogged workload of three users with
unequal tickets (one of them running 2-GPU gangs, every user asking more GPUs than its share)
and, after a warm-up, measures over a window of quanta:

- each user's GPU-seconds received (split-stride's usage record) against its entitlement (the
  trading auction's shares, the GPUs its jobs can use, sampled every second), as GPUs;
- the fraction of GPU-seconds busy.

The same workload then runs through the simulator's `gandiva-fair` policy (the same state
machine, quantum by quantum, no migration or checkpoint costs) for the same number of quanta,
and both are printed side by side. Targets: every user at least 90% of its entitlement, busy at
least 90% at a 6 s quantum and 97% at 60 s.

With ``--shares FILE`` (docs/configuration.md, "Shares file", over the users ann, ben and cat;
bench/shares.toml puts them under three levels of accounts) both the cluster
(`GFAIR_SHARES_FILE`) and the simulator's policy divide the GPUs down the file's accounts, and
every account's entitled and received GPUs (its users' sums) are printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gfair.bus.logs import configure_logging
from gfair.client import GfairClient
from gfair.core.cluster import parse_cluster_spec
from gfair.core.scheduler import SchedulerConfig
from gfair.core.shares_tree import ShareTree
from gfair.embedded_cluster import ClusterOptions, EmbeddedCluster
from gfair.gavel import load_throughputs
from gfair.shares import read_shares
from gfair.sim.gandiva_fair_machine import GandivaFairMachine
from gfair.sim.trace import TraceJob


@dataclass(frozen=True)
class Team:
    name: str
    tickets: float
    job_type: str
    gpus: int  # per job
    jobs: int


TEAMS = (
    Team("ann", 1.0, "ResNet-50 (batch size 32)", 1, 6),
    Team("ben", 1.0, "A3C", 1, 6),
    Team("cat", 2.0, "LM (batch size 20)", 2, 5),
)


@dataclass
class Measured:
    received: dict[str, float]  # user -> GPUs on average over the window
    entitled: dict[str, float]
    busy: float


def long_job(job_type: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gfair.sdk.synthetic",
        "--job-type",
        job_type,
        "--duration-s",
        "1000000",
        "--checkpoint-every",
        "200",
    ]


async def live(
    cluster_spec: str,
    quantum_s: float,
    quanta: int,
    warmup: int,
    trading: bool,
    shares: Path | None = None,
) -> Measured:
    gpus = sum(s.gpus for s in parse_cluster_spec(cluster_spec).servers)
    with tempfile.TemporaryDirectory(prefix="gfair-fairness-") as data_dir:
        options = ClusterOptions(
            cluster=cluster_spec,
            quantum_s=quantum_s,
            data_dir=Path(data_dir),
            user_tickets={t.name: t.tickets for t in TEAMS},
            log_level="WARNING",
            env={} if trading else {"GFAIR_TRADING": "false"},
            shares_file=shares,
        )
        async with (
            EmbeddedCluster(options) as cluster,
            await GfairClient.connect(cluster.nats_url) as client,
        ):
            for team in TEAMS:
                for n in range(team.jobs):
                    await client.submit(
                        team.name,
                        team.gpus,
                        long_job(team.job_type),
                        job_type=team.job_type,
                        job_id=f"{team.name}-{n}",
                        wait="none",
                    )
            await asyncio.sleep(warmup * quantum_s)
            before = await client.stride()
            began = time.monotonic()
            entitled_s: dict[str, float] = {}
            last = began
            while (now := time.monotonic()) - began < quanta * quantum_s:
                await asyncio.sleep(min(1.0, quanta * quantum_s - (now - began)))
                shares = await client.shares()
                now = time.monotonic()
                if shares is not None:
                    for user, share in shares.users.items():
                        usable = sum(share.usable().values())
                        entitled_s[user] = entitled_s.get(user, 0.0) + usable * (now - last)
                last = now
            after = await client.stride()
            window = time.monotonic() - began
    assert before is not None and after is not None
    received = {
        t.name: (
            sum(after.usage.get(t.name, {}).values()) - sum(before.usage.get(t.name, {}).values())
        )
        / window
        for t in TEAMS
    }
    return Measured(
        received,
        {t.name: entitled_s.get(t.name, 0.0) / window for t in TEAMS},
        sum(received.values()) / gpus,
    )


def simulated(
    cluster_spec: str, quanta: int, warmup: int, trading: bool, tree: ShareTree | None = None
) -> Measured:
    cluster = parse_cluster_spec(cluster_spec)
    gpus = sum(s.gpus for s in cluster.servers)
    config = SchedulerConfig(trading=trading, shares=tree)
    policy = GandivaFairMachine(
        cluster, {t.name: t.tickets for t in TEAMS}, load_throughputs(), config
    )
    specs = {
        f"{team.name}-{n}": TraceJob(
            f"{team.name}-{n}", team.name, team.gpus, 0.0, float("inf"), team.job_type
        )
        for team in TEAMS
        for n in range(team.jobs)
    }
    for spec in specs.values():
        assert policy.submit(spec, 0.0).accepted
    received = {t.name: 0.0 for t in TEAMS}
    entitled = {t.name: 0.0 for t in TEAMS}
    for quantum in range(warmup + quanta):
        runs = policy.plan(quantum * config.quantum_s).runs
        if quantum < warmup:
            continue
        for job_id in {job for jobs in runs.values() for job in jobs}:
            received[specs[job_id].user] += specs[job_id].gpus
        for user, account in policy.machine.users.items():
            entitled[user] += sum(account.entitled.values())
    return Measured(
        {u: v / quanta for u, v in received.items()},
        {u: v / quanta for u, v in entitled.items()},
        sum(received.values()) / quanta / gpus,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", default="v100:1x4,k80:1x4")
    parser.add_argument("--quantum", type=float, default=6.0)
    parser.add_argument("--quanta", type=int, default=20)
    parser.add_argument("--warmup-quanta", type=int, default=3)
    parser.add_argument("--no-trading", action="store_true")
    parser.add_argument("--shares", type=Path, help="a shares file over ann, ben and cat")
    args = parser.parse_args()
    tree = read_shares(args.shares) if args.shares is not None else None
    configure_logging("bench", level="WARNING", fmt="console")
    trading = not args.no_trading
    print(
        f"live fairness: {args.cluster}, quantum {args.quantum:g} s, {args.quanta} quanta "
        f"measured after {args.warmup_quanta}, trading {'on' if trading else 'off'}"
        + (f", shares {args.shares}" if args.shares is not None else "")
    )
    sim = simulated(args.cluster, args.quanta, args.warmup_quanta, trading, tree)
    got = asyncio.run(
        live(args.cluster, args.quantum, args.quanta, args.warmup_quanta, trading, args.shares)
    )
    print(
        f"  {'user':<10}{'tickets':>8}  {'live entitled':>14}{'received':>10}{'ratio':>8}"
        f"  {'sim entitled':>13}{'received':>10}{'ratio':>8}"
    )
    rows = [(team.name, team.tickets, (team.name,)) for team in TEAMS]
    if tree is not None:
        rows = [
            (team.name, tree.tickets_of(team.name, team.tickets), (team.name,)) for team in TEAMS
        ] + [
            (
                f"{path}/",
                tickets,
                tuple(t.name for t in TEAMS if path in tree.ancestors(tree.account_of(t.name))),
            )
            for path, tickets in sorted(tree.accounts.items())
        ]
    for name, tickets, users in rows:
        got_entitled = sum(got.entitled[u] for u in users)
        got_received = sum(got.received[u] for u in users)
        sim_entitled = sum(sim.entitled[u] for u in users)
        sim_received = sum(sim.received[u] for u in users)
        print(
            f"  {name:<10}{tickets:>8g}  {got_entitled:>14.2f}"
            f"{got_received:>10.2f}{got_received / max(got_entitled, 1e-9):>8.0%}"
            f"  {sim_entitled:>13.2f}{sim_received:>10.2f}"
            f"{sim_received / max(sim_entitled, 1e-9):>8.0%}"
        )
    print(f"  busy: live {got.busy:.0%}, simulator {sim.busy:.0%}")


if __name__ == "__main__":
    main()
