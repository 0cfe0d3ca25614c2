"""`gfair up --cluster local`: the one server is this machine, its GPUs found through NVML."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gfair.cli.main import main
from gfair.embedded_cluster import ClusterOptions, EmbeddedCluster, options
from gfair.node.discovery import local_cluster_spec
from node.fake_nvml import FakeDevice, FakeNvml, NVMLError_LibraryNotFound


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    """This machine's NVML, scripted: whatever GPUs the test gives it."""
    nvml = FakeNvml(devices=[])
    monkeypatch.setattr(options, "local_cluster_spec", lambda: local_cluster_spec(nvml))
    options._local_spec.cache_clear()
    yield nvml
    options._local_spec.cache_clear()


def test_the_local_cluster_is_this_machine_with_its_own_gpus(
    machine: FakeNvml, tmp_path: Path
) -> None:
    machine.devices = [FakeDevice("NVIDIA H200", f"GPU-{i}", memory_total=1 << 37) for i in (0, 1)]
    cluster = EmbeddedCluster(ClusterOptions(cluster="local", data_dir=tmp_path))
    assert cluster.node_ids == ("h200-0",)
    assert cluster.servers.gpus_per_generation() == {"h200": 2}


def test_without_gpus_gfair_up_local_says_why_and_starts_nothing(
    machine: FakeNvml, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    machine.init_error = NVMLError_LibraryNotFound()
    data = tmp_path / "data"
    assert main(["up", "--cluster", "local", "--data-dir", str(data)]) == 2
    error = capsys.readouterr().err
    assert "this machine's GPUs, found through NVML: NVML is unavailable" in error
    assert "NVML Shared Library Not Found" in error
    assert "--simulate-gpus" not in error  # an executor's flag, not gfair up's
    assert not data.exists()


def test_virtual_nodes_cannot_be_this_machine() -> None:
    with pytest.raises(ValueError, match="virtual nodes simulate their GPUs"):
        ClusterOptions(cluster="local", virtual=True)
