"""Observability of the compose deployment in a real engine, wired as its users get it.

One deployment (nats, the services, two executors of two GPU generations, Prometheus with the
shipped configuration, and a stand-in OTLP collector) runs a short workload of two tenants
that time-slices; then:
- `promtool check config` passes on the shipped Prometheus file, in the Prometheus container;
- Prometheus has every gfair service as a target that is up;
- every query of the Grafana dashboard returns a series through Prometheus's HTTP API;
- a job's spans left the containers over OTLP, and `gfair trace` shows them as one trace
  across at least four services.
Before any job, the counters are already there at 0 (an idle panel shows 0, not "No data").
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from bench.compose_deployment import (
    COMPOSE_FILE,
    CONTROL_PLANE,
    ROOT,
    ComposeProject,
    connected,
    synthetic,
)

from gfair.client import ConnectOptions, GfairClient
from gfair.events.reasons import SuspendReason
from gfair.events.states import JobState

from .conftest import ProjectFactory

# compose.yaml's executor and its `gpu` profile's, the latter on simulated GPUs here.
EXECUTORS = {"node-executor": "sim-1", "node-executor-gpu": "gpu-1"}
GFAIR_SERVICES = (*CONTROL_PLANE, *EXECUTORS)
OVERLAY = ROOT / "tests" / "docker" / "compose.observability.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "gfair.json"
# The shipped file, where compose.yaml mounts it in the Prometheus container.
PROMETHEUS_CONFIG = "/etc/prometheus/prometheus.yml"
GFAIR = str(Path(sys.executable).parent / "gfair")
# Grafana's own variables as a panel over the last hour would fill them; a variable not
# here fails the test rather than reaching Prometheus unfilled.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
# Two servers of two GPUs of different generations (of about the same speed for the job):
# the auction has two pools to trade between, and four two-GPU jobs time-slice on them.
GPUS = {"GFAIR_SIMULATE_GPUS": "v100:2", "GFAIR_SIMULATE_GPUS_2": "p100:2"}
# Each job's length in seconds of V100 work: four 6 s quanta (GFAIR_QUANTUM_S), so that
# the other tenant's job waiting beside it takes its turn: the executors count suspends.
JOB_S = 24
# (tenant, its password variable, its jobs)
TENANTS = (
    ("alice", "GFAIR_TENANT_ALICE_PASSWORD", ("obs-a1", "obs-a2")),
    ("bob", "GFAIR_TENANT_BOB_PASSWORD", ("obs-b1", "obs-b2")),
)
TRACED = ("alice", "obs-a1")
# Every counter a panel reads, and the migrations the executors count.
COUNTERS = (
    "gfair_job_suspends_total",
    "gfair_job_migrations_total",
    "gfair_job_failures_total",
    "gfair_dead_letters_total",
    "gfair_trades_total",
)

T = TypeVar("T")


def until(check: Callable[[], T | None], timeout_s: float, what: Callable[[], str]) -> T:
    """`check()`'s first answer that is not None (or empty), polled until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what()}")
        time.sleep(1)


class Prometheus:
    """Prometheus's HTTP API, through its port published on 127.0.0.1."""

    def __init__(self, port: str) -> None:
        self.base = f"http://127.0.0.1:{port}/api/v1"

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            answer = json.load(response)
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The series of an instant query: each with its labels ("metric") and "value"."""
        result: list[dict[str, Any]] = self.get("query", query=expr)["result"]
        return result

    def up_services(self) -> set[str]:
        return {s["metric"]["gfair_service"] for s in self.query("up == 1")}


def panel_queries() -> dict[str, str]:
    """Every query of the dashboard, by its panel's title and target, variables filled."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = {}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            name = f"{panel['title']} [{target['refId']}]"
            assert "$" not in expr, f"{name}: a variable this test cannot fill: {expr}"
            found[name] = expr
    return found


async def run_workload(project: ComposeProject) -> dict[tuple[str, str], JobState]:
    """Each tenant submits its jobs with its own login; every job's end state."""
    operator = project.login("operator", "GFAIR_OPERATOR_PASSWORD")
    async with await connected(operator, project, EXECUTORS.values()) as client:
        for user, password, jobs in TENANTS:
            login: ConnectOptions = project.login(user, password)
            async with await GfairClient.connect(options=login) as tenant:
                for job_id in jobs:
                    submitted = await tenant.submit(user, 2, synthetic(JOB_S), job_id=job_id)
                    assert not submitted.state.terminal, submitted  # accepted, not refused
        wanted = {(user, job) for user, _, jobs in TENANTS for job in jobs}
        deadline = time.monotonic() + 240
        while True:
            states = {(j.user, j.job_id): j.state for j in await client.jobs()}
            if wanted <= states.keys() and all(states[j].terminal for j in wanted):
                return {j: states[j] for j in wanted}
            assert time.monotonic() < deadline, f"jobs not ended: {states}\n{project.logs()}"
            await asyncio.sleep(1)


def job_trace(span_file: Path, user: str, job_id: str) -> dict[str, Any] | None:
    """`gfair trace --json` of the job, as the CLI on the host prints it; None until the
    spans of its end have arrived."""
    result = subprocess.run(
        [GFAIR, "trace", "--span-file", str(span_file), f"{user}/{job_id}", "--json"],
        env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        return None  # no span file, or no span of the job, yet
    found: dict[str, Any] = json.loads(result.stdout)
    names = {span["name"] for span in found["spans"]}
    return found if "publish gfair.job.completed.v1" in names else None


def test_prometheus_scrapes_every_service_each_panel_has_data_and_a_job_is_one_trace(
    compose_project: ProjectFactory, tmp_path: Path
) -> None:
    spans = tmp_path / "spans"
    spans.mkdir()
    project = compose_project(
        files=(COMPOSE_FILE, OVERLAY),
        extra={
            **GPUS,
            # Also for `down`, which leaves the containers of inactive profiles running.
            "COMPOSE_PROFILES": "gpu",
            "GFAIR_SPAN_DIR": str(spans),
            "GFAIR_SPAN_USER": f"{os.getuid()}:{os.getgid()}",
        },
    )
    project.up("nats", *CONTROL_PLANE, "otel-collector", "prometheus", *EXECUTORS)

    checked = project.compose(
        "exec", "-T", "prometheus", "promtool", "check", "config", PROMETHEUS_CONFIG
    )
    assert f"SUCCESS: {PROMETHEUS_CONFIG}" in checked, checked

    prometheus = Prometheus(project.variables["GFAIR_PROMETHEUS_PORT"])
    until(
        lambda: prometheus.up_services() >= set(GFAIR_SERVICES),
        90,
        lambda: f"gfair services up in Prometheus: {sorted(prometheus.up_services())}",
    )

    # Idle, before any job: every counter is there at 0; each executor's suspends for every
    # reason, the auction's trades once it knows both pools.
    def idle_counters() -> dict[str, dict[str, float]] | None:
        found = {
            counter: {
                json.dumps(s["metric"], sort_keys=True): float(s["value"][1])
                for s in prometheus.query(counter)
            }
            for counter in COUNTERS
        }
        return found if all(found.values()) else None

    idle = until(
        idle_counters, 60, lambda: f"no series: {[c for c in COUNTERS if not prometheus.query(c)]}"
    )
    for counter, series in idle.items():
        assert set(series.values()) == {0.0}, (counter, series)
    suspends_idle = {(s["node"], s["reason"]) for s in map(json.loads, idle[COUNTERS[0]])}
    every = {(node, reason.value) for node in EXECUTORS.values() for reason in SuspendReason}
    assert suspends_idle == every

    started = time.monotonic()
    ended = asyncio.run(run_workload(project))
    workload_s = time.monotonic() - started
    assert set(ended.values()) == {JobState.COMPLETED}, ended

    # Every panel's query returns a series; Prometheus scrapes each 10 s, so the last
    # increments may take one more scrape to show.
    queries = panel_queries()

    def empty_panels() -> list[str]:
        return [name for name, expr in queries.items() if not prometheus.query(expr)]

    until(lambda: not empty_panels() or None, 30, lambda: f"no data: {empty_panels()}")
    # The workload time-sliced: the suspends counted show through the panel's metric.
    suspends = prometheus.query('sum(gfair_job_suspends_total{reason="time_slice"})')
    assert float(suspends[0]["value"][1]) > 0, project.logs(EXECUTORS)

    # The spans crossed the network to the collector's stand-in; one job, one trace.
    life = until(
        lambda: job_trace(spans / "spans.jsonl", *TRACED),
        60,
        lambda: f"no complete trace of {TRACED} in {sorted(p.name for p in spans.iterdir())}",
    )
    services = {span["service"] for span in life["spans"]}
    assert len(services) >= 4, services
    assert services >= {"placement", "split-stride", "node-executor", "failure-detector"}
    assert life["user"] == TRACED[0] and life["job_id"] == TRACED[1]
    print(
        f"\n{len(queries)} dashboard queries, all with data; workload {workload_s:.0f} s; "
        f"trace of {'/'.join(TRACED)}: {len(life['spans'])} spans, {len(services)} services"
    )
