"""`gfair up`: a whole gfair cluster on this machine, its GPUs simulated or its own, until Ctrl-C.

    gfair up --cluster v100:2x4,k80:2x4 --quantum 3 --tickets alice=2 bob=1

Starts an embedded nats-server (unless --nats names one), creates the streams and buckets, then
the six services and the query service, one node executor per server of the spec, and waits
until all are up. Logs go to <data-dir>/logs, spans to <data-dir>/traces/spans.jsonl. Ctrl-C
or SIGTERM stops it all.

The embedded server listens on 4222, where tools look by default, when that port is free, else on
any free port. Either way the running cluster is described in <data-dir>/context.json and in a
per-user context file, which the other commands read when neither --nats nor $GFAIR_NATS_URL
is given (`gfair.client.cluster_context`); both are removed when the cluster stops.

    gfair up --virtual --cluster v100:100x8,k80:100x8

With --virtual a few processes run every server's executor, --virtual-per-process servers
each (default 100), and jobs run no process of their own (virtual nodes: only the synthetic job
runs, at its simulated speed), so one machine holds a cluster of a thousand servers for scale
tests.

    gfair up --cluster local

With --cluster local the one server is this machine and its jobs run on its own GPUs, found
through NVML (one generation; `nvidia-smi` names them), instead of simulated ones. Its quantum
is 60 s unless --quantum says otherwise: a real job's start-up (importing PyTorch, initialising
CUDA: 4 to 6 s on an H200 machine) must fit in a time slice, or a job not submitted with
--prepare is stopped while it comes up at every slice and never trains.

    gfair up --auth deploy/nats/tenants.toml

With --auth the nats-server requires a login, with the tenants file's authorization rendered
into <data-dir>/auth/auth.conf (the file itself is only read), and every process, tenant and
the operator gets a random password, new at every start. The simulated servers are added as
node users; the services' consumers are protected. How the operator and each tenant log in is
printed and kept, readable by this user only, in <data-dir>/auth/logins.txt and
<data-dir>/auth/<user>.env (`. .gfair/auth/alice.env` in a shell, then `gfair submit ...`),
removed when the cluster stops.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from gfair.cli.arguments import add_command, positive
from gfair.cli.speeds import generation_warnings
from gfair.client.cluster_context import CONTEXT_FILE, read_context
from gfair.client.connection import DEFAULT_NATS_URL, NATS_URL_ENV
from gfair.cluster_logins import LOGINS_FILE
from gfair.core.kernel import DEFAULT_QUANTUM_S
from gfair.embedded_cluster import ClusterError, ClusterOptions, EmbeddedCluster
from gfair.node.discovery import LOCAL_CLUSTER
from gfair.node.job_cgroup import AUTO, CgroupError, locate
from gfair.node.job_limits import JobLimits, LimitError, check_host, parse_size
from gfair.shares import read_shares
from gfair.tenancy import TenantsError
from gfair_services.node_executor.settings import DEFAULT_VIRTUAL_NODES_PER_PROCESS
from gfair_services.tenants import parse_user_tickets


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "up", __doc__)
    parser.add_argument(
        "--cluster",
        default="v100:2x4,k80:2x4",
        help="servers per generation, e.g. v100:2x4,k80:2x4 (default), or 'local': this "
        "machine's own GPUs (NVML)",
    )
    parser.add_argument(
        "--quantum",
        type=positive,
        metavar="SECONDS",
        help=f"default {SIMULATED_QUANTUM_S:g}; {LOCAL_QUANTUM_S:g} with --cluster local",
    )
    parser.add_argument(
        "--nats", metavar="URL", help="use this NATS server instead of starting one"
    )
    parser.add_argument("--data-dir", type=Path, default=Path(".gfair"), help="default ./.gfair")
    parser.add_argument("--span-file", type=Path, help="default <data-dir>/traces/spans.jsonl")
    parser.add_argument(
        "--tickets",
        nargs="+",
        default=[],
        metavar="USER=TICKETS",
        help="users' tickets, e.g. alice=2 bob=1 (others: 1)",
    )
    parser.add_argument(
        "--shares",
        type=Path,
        metavar="FILE",
        help="shares file (TOML): accounts in a tree above the users (docs/configuration.md)",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a service setting for every process, e.g. --set fail_after_s=10",
    )
    parser.add_argument(
        "--auth",
        type=Path,
        metavar="TENANTS_FILE",
        help="require logins: tenants and authorization from this file "
        "(deploy/nats/tenants.toml); passwords are generated",
    )
    parser.add_argument(
        "--job-memory-per-gpu",
        default=DEFAULT_MEMORY_PER_GPU,
        metavar="SIZE",
        help=f"memory a job may use per GPU it holds (default {DEFAULT_MEMORY_PER_GPU}; "
        "GFAIR_JOB_MEMORY_PER_GPU in the environment or --set wins; empty: no limit)",
    )
    parser.add_argument(
        "--job-cpus-per-gpu",
        default=DEFAULT_CPUS_PER_GPU,
        metavar="CPUS",
        help=f"CPUs a job may use per GPU it holds (default {DEFAULT_CPUS_PER_GPU}; "
        "GFAIR_JOB_CPUS_PER_GPU or --set wins; empty: no limit)",
    )
    parser.add_argument(
        "--virtual",
        action="store_true",
        help="virtual nodes: a few processes run every server's executor, jobs run no "
        "process (python -m gfair.sdk.synthetic only), for clusters of a thousand servers",
    )
    parser.add_argument(
        "--virtual-per-process",
        type=int,
        default=DEFAULT_VIRTUAL_NODES_PER_PROCESS,
        metavar="N",
        help="with --virtual: servers per process, each process on a NATS connection of its "
        f"own (default {DEFAULT_VIRTUAL_NODES_PER_PROCESS})",
    )
    parser.add_argument("--log-level", default="INFO", help="default INFO")
    parser.set_defaults(func=_run)


# Short quanta show time slicing quickly on simulated GPUs; real jobs need their start-up to fit
# in one (the deployment's quantum, compose.yaml).
SIMULATED_QUANTUM_S = 3.0
LOCAL_QUANTUM_S = DEFAULT_QUANTUM_S
# One GPU's share of a development machine (24 GiB, 2 cores): a one-GPU PyTorch job gets 8 GiB
# and a core, a four-GPU one 32 GiB (a cap, not a reservation) and four cores' quota.
DEFAULT_MEMORY_PER_GPU = "8G"
DEFAULT_CPUS_PER_GPU = "1"


def _job_limits(args: argparse.Namespace, env: dict[str, str]) -> dict[str, str]:
    """The per-GPU limits for every executor, unless the operator set them already; where the
    host cannot enforce them (no controller for this user), none, with a note."""
    wanted = {
        "GFAIR_JOB_MEMORY_PER_GPU": args.job_memory_per_gpu,
        "GFAIR_JOB_CPUS_PER_GPU": args.job_cpus_per_gpu,
    }
    limits = {
        name: value
        for name, value in wanted.items()
        if value.strip() and name not in env and name not in os.environ
    }
    if not limits:
        return {}
    try:
        memory = limits.get("GFAIR_JOB_MEMORY_PER_GPU")
        cpus = limits.get("GFAIR_JOB_CPUS_PER_GPU")
        check_host(
            JobLimits(
                memory_per_gpu=parse_size(memory) if memory else None,
                cpus_per_gpu=float(cpus) if cpus else None,
            ),
            locate(env.get("GFAIR_JOB_CGROUPS", os.environ.get("GFAIR_JOB_CGROUPS", AUTO))),
        )
    except (LimitError, CgroupError, ValueError) as error:
        print(f"gfair up: jobs run without memory and CPU limits: {error}", file=sys.stderr)
        return {}
    return limits


def _default_port() -> int:
    return int(DEFAULT_NATS_URL.rsplit(":", 1)[1])


def _env(settings: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in settings:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--set {item!r}: expected NAME=VALUE")
        env[f"GFAIR_{name.strip().upper()}"] = value
    return env


def _run(args: argparse.Namespace) -> int:
    if args.auth is not None and args.nats is not None:
        print(
            "gfair up: --auth configures the nats-server gfair up starts; with --nats, "
            "that server's own authorization applies (deploy/nats/README.md)",
            file=sys.stderr,
        )
        return 2
    try:
        options = ClusterOptions(
            cluster=args.cluster,
            quantum_s=args.quantum or _default_quantum(args.cluster),
            data_dir=args.data_dir,
            nats_url=args.nats,
            span_file=args.span_file,
            user_tickets=parse_user_tickets(",".join(args.tickets)),
            shares_file=args.shares,
            log_level=args.log_level.upper(),
            env=(env := _env(args.settings)) | _job_limits(args, env),
            preferred_port=_default_port(),
            announce=True,
            auth=args.auth,
            virtual=args.virtual,
            virtual_per_process=args.virtual_per_process,
        )
        servers = options.servers()  # the spec is checked before anything starts
        if args.shares is not None:
            read_shares(args.shares)  # and the shares file: every service would refuse it
    except ValueError as error:
        print(f"gfair up: {error}", file=sys.stderr)
        return 2
    for warning in generation_warnings(server.generation for server in servers.servers):
        print(f"gfair up: warning: {warning}", file=sys.stderr)
    try:
        options.tenants()  # and the tenants file, with --auth
    except TenantsError as error:
        print(f"gfair up: --auth {error}", file=sys.stderr)
        return 2
    running = read_context(args.data_dir / CONTEXT_FILE)
    if running is not None and running.running:
        # Two clusters on one data dir would run two brokers on one store.
        print(
            f"gfair up: a cluster already runs from {args.data_dir} (pid {running.pid}, NATS "
            f"{running.nats_url}); stop it first or give another --data-dir",
            file=sys.stderr,
        )
        return 1
    try:
        return asyncio.run(_up(options))
    except ClusterError as error:
        print(f"gfair up: {error}", file=sys.stderr)
        return 1


async def _up(options: ClusterOptions) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None

    def on_signal() -> None:
        if not stop.is_set():
            stop.set()
            print("\nstopping...", file=sys.stderr, flush=True)

    def on_signal_while_starting() -> None:
        on_signal()
        main.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal_while_starting)
    cluster = EmbeddedCluster(options)
    try:
        await cluster.start()
    except asyncio.CancelledError:
        return 130
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        _print_summary(cluster)
        await stop.wait()
    finally:
        await cluster.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return 0


def _print_summary(cluster: EmbeddedCluster) -> None:
    options = cluster.options
    gpus = ", ".join(
        f"{g}: {len(cluster.servers.by_generation(g))} servers, {n} GPUs"
        for g, n in cluster.servers.gpus_per_generation().items()
    )
    lines = [
        "gfair cluster is up",
        f"  NATS         {cluster.nats_url}",
        f"  GPUs         {gpus} ({_kind_of_gpus(options)})",
        f"  quantum      {options.quantum_s:g} s",
        f"  data         {cluster.data_dir}",
        f"  logs         {cluster.logs_dir}",
        f"  spans        {cluster.span_file}",
        f"  checkpoints  {cluster.checkpoint_root}",
        "  processes    "
        + ", ".join(f"{name} ({child.pid})" for name, child in cluster.children.items()),
        "",
        *_how_tools_find_it(cluster),
        "  then: gfair submit ..., gfair jobs, gfair users; Ctrl-C stops the cluster",
        *_logins(cluster),
    ]
    print("\n".join(lines), flush=True)


def _default_quantum(cluster: str) -> float:
    return LOCAL_QUANTUM_S if cluster == LOCAL_CLUSTER else SIMULATED_QUANTUM_S


def _kind_of_gpus(options: ClusterOptions) -> str:
    if options.virtual:
        return "virtual"
    return "this machine's, NVML" if options.local_gpus else "simulated"


def _logins(cluster: EmbeddedCluster) -> list[str]:
    if cluster.logins is None:
        return []
    where = cluster.auth_dir
    return [
        "",
        f"logins required (authorization from {cluster.options.auth}, rendered into "
        f"{where / 'auth.conf'});",
        "every tool needs one of these (kept in "
        f"{where / LOGINS_FILE}, or `. {where}/<user>.env`):",
        cluster.logins.connect_text(cluster.nats_url).rstrip("\n"),
    ]


def _how_tools_find_it(cluster: EmbeddedCluster) -> list[str]:
    exported = os.environ.get(NATS_URL_ENV, "").strip()
    if not cluster.context_files or (exported and exported != cluster.nats_url):
        # $GFAIR_NATS_URL comes before the context file for every tool.
        return [f"  export {NATS_URL_ENV}={cluster.nats_url}"]
    return [
        "  tools on this machine find it through "
        + " and ".join(str(path) for path in cluster.context_files),
        f"  (or: export {NATS_URL_ENV}={cluster.nats_url})",
    ]
