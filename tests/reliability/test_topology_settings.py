"""Replication and ack waits reach every service from the shared settings (issue 5, parts 2-3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gfair.bus.service import Service
from gfair.embedded_cluster import SCHEDULER_SERVICES, ClusterOptions
from gfair_services.entrypoint import service_module, settings_class
from gfair_services.node_executor import build_service as build_executor
from gfair_services.node_executor.settings import NodeExecutorSettings
from gfair_services.topology import DEFAULT_ACK_WAIT_S, cluster_topology


def scheduler_service(name: str, **fields: object) -> Service:
    module = service_module(name)
    service: Service = module.build_service(settings_class(module)(**fields))
    return service


def replicas_of(service: Service) -> set[int]:
    topology = service.topology
    return {s.replicas for s in topology.streams} | {b.replicas for b in topology.buckets}


@pytest.mark.parametrize("name", SCHEDULER_SERVICES)
def test_every_service_declares_the_replicas_and_ack_wait_it_is_given(name: str) -> None:
    service = scheduler_service(name, replicas=3, ack_wait_s=1.5)
    assert replicas_of(service) == {3}
    # The contract's five streams and the jobs' output.
    assert len(service.topology.buckets) >= 6 and len(service.topology.streams) == 6
    assert {route.consumer.ack_wait_s for route in service.routes} == {1.5}


@pytest.mark.parametrize("name", SCHEDULER_SERVICES)
def test_by_default_one_replica_and_a_short_ack_wait(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GFAIR_REPLICAS", raising=False)
    monkeypatch.delenv("GFAIR_ACK_WAIT_S", raising=False)
    service = scheduler_service(name)
    assert replicas_of(service) == {1}
    assert {route.consumer.ack_wait_s for route in service.routes} == {DEFAULT_ACK_WAIT_S}


def test_gfair_replicas_reaches_services_and_the_executor_alike(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GFAIR_REPLICAS", "3")
    assert {s.replicas for s in cluster_topology().streams} == {3}
    assert replicas_of(scheduler_service("placement")) == {3}
    # The executor passes no replicas of its own: it reads the same variable.
    executor = build_executor(
        NodeExecutorSettings(
            node_id="n1",
            simulate_gpus="v100:1",
            checkpoint_root=tmp_path / "checkpoints",
            work_root=tmp_path / "work",
        )
    )
    assert replicas_of(executor) == {3}


def test_a_replication_beyond_jetstreams_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GFAIR_REPLICAS", "7")
    with pytest.raises(ValueError, match="replicas"):
        cluster_topology()


def test_a_three_broker_cluster_defaults_to_three_replicas() -> None:
    # The broker-loss test runs one and reads the replication back from JetStream.
    assert ClusterOptions(brokers=3).stream_replicas == 3
    assert ClusterOptions(brokers=3, replicas=2).stream_replicas == 2
    assert ClusterOptions().stream_replicas == 1


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"brokers": 0}, "brokers"),
        ({"brokers": 3, "nats_url": "nats://x:4222"}, "nats_url"),
        ({"brokers": 1, "replicas": 3}, "replicas need as many brokers"),
        ({"brokers": 3, "replicas": 9}, "replicas must be within"),
    ],
)
def test_cluster_options_that_cannot_work_are_refused(
    options: dict[str, object], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        ClusterOptions(**options)  # type: ignore[arg-type]
