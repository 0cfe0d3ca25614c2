from __future__ import annotations

import importlib

import anyio
import pytest

from gfair.node.discovery import local_cluster_spec, open_gpus
from gfair.node.generation import generation_of
from gfair.node.gpu import NoGpusError
from gfair.node.nvml import NvmlGpus
from gfair.node.simulated import MODELS, SimulatedGpus, parse_gpu_spec
from gfair.node.telemetry import telemetry_reports

from .fake_nvml import FakeDevice, FakeNvml, NVMLError_LibraryNotFound

GIB = 1024**3


@pytest.mark.parametrize(
    ("name", "generation"),
    [
        ("Tesla V100-SXM2-16GB", "v100"),
        ("Tesla V100-PCIE-32GB", "v100"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("Tesla K80", "k80"),
        ("Tesla P100-PCIE-16GB", "p100"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GeForce RTX 4090", "nvidia-geforce-rtx-4090"),
    ],
)
def test_generation_of_nvml_names(name: str, generation: str) -> None:
    assert generation_of(name) == generation


def test_generation_slug_is_a_bounded_token() -> None:
    slug = generation_of("Some Vendor's  Experimental/GPU " + "x" * 100)
    assert len(slug) <= 64
    assert slug.startswith("some-vendor-s-experimental-gpu-")
    with pytest.raises(ValueError, match="no letters or digits"):
        generation_of("---")


# ----- simulated ------------------------------------------------------------------------


def test_gpu_spec_parsing() -> None:
    assert parse_gpu_spec("v100:4, K80:2") == [("v100", 4), ("k80", 2)]
    for bad in ("v100", "v100:0", "v100:x", "", "v100:2,,k80:1"):
        with pytest.raises(ValueError, match="GPU spec entry"):
            parse_gpu_spec(bad)


def test_simulated_inventory_names_map_back_to_their_generation() -> None:
    gpus = SimulatedGpus("v100:2,k80:1,h200:1,l4:1", node_id="n1")
    inventory = gpus.inventory()
    assert [g.index for g in inventory] == [0, 1, 2, 3, 4]
    assert [g.generation for g in inventory] == ["v100", "v100", "k80", "h200", "l4"]
    assert all(g.simulated for g in inventory)
    assert inventory[0].memory_total_bytes == MODELS["v100"].memory_total_bytes
    for model_generation, model in MODELS.items():
        assert generation_of(model.name) == model_generation
    uuids = [g.uuid for g in inventory]
    assert len(set(uuids)) == len(uuids)
    assert all(u.startswith("GPU-") for u in uuids)
    # Same node, same UUIDs (stable across restarts); another node, other UUIDs.
    assert [g.uuid for g in SimulatedGpus("v100:2", node_id="n1").inventory()] == uuids[:2]
    assert not set(uuids) & {g.uuid for g in SimulatedGpus("v100:2", node_id="n2").inventory()}


def test_simulated_telemetry_follows_which_gpus_are_busy() -> None:
    gpus = SimulatedGpus("v100:2")
    samples = []
    for _ in range(8):
        samples = gpus.sample({1})
    idle, busy = samples
    assert idle.utilization_pct == 0.0
    assert idle.memory_used_bytes == 0
    assert busy.utilization_pct is not None and 90.0 <= busy.utilization_pct <= 100.0
    assert busy.memory_used_bytes is not None and busy.memory_used_bytes > 10 * GIB
    assert busy.temperature_c is not None and idle.temperature_c is not None
    assert busy.temperature_c > idle.temperature_c + 20
    assert busy.power_w is not None and idle.power_w is not None
    assert busy.power_w > 3 * idle.power_w

    # Once the job leaves, the GPU cools down and idles.
    for _ in range(20):
        samples = gpus.sample(set())
    assert samples[1].utilization_pct == 0.0
    assert samples[1].temperature_c is not None and samples[1].temperature_c < 36


def test_simulated_telemetry_is_deterministic() -> None:
    pattern = [{0}, {0, 1}, set(), {1}, {0}]
    a, b = SimulatedGpus("a100:2"), SimulatedGpus("a100:2")
    for busy in pattern:
        left = [(s.utilization_pct, s.temperature_c, s.power_w) for s in a.sample(busy)]
        right = [(s.utilization_pct, s.temperature_c, s.power_w) for s in b.sample(busy)]
        assert left == right


def test_simulated_xid_injection_is_reported_once() -> None:
    gpus = SimulatedGpus("v100:2")
    assert gpus.poll_xid_errors() == []
    gpus.inject_xid(1, 79)
    [error] = gpus.poll_xid_errors()
    assert (error.index, error.uuid, error.xid) == (1, gpus.inventory()[1].uuid, 79)
    assert gpus.poll_xid_errors() == []


# ----- NVML (through a fake module object) ------------------------------------------------


def fake_machine() -> FakeNvml:
    return FakeNvml(
        devices=[
            FakeDevice(b"Tesla V100-SXM2-16GB", "GPU-aaa", 16 * GIB, 3 * GIB, 87, 66, 250_500),
            FakeDevice("NVIDIA H100 80GB HBM3", "GPU-bbb", 80 * GIB, power_mw=None,
                       xid_supported=False),
        ]
    )  # fmt: skip


def test_nvml_inventory_and_samples() -> None:
    nvml = fake_machine()
    gpus = NvmlGpus(nvml, clock=lambda: 123.0)
    v100, h100 = gpus.inventory()
    assert (v100.index, v100.uuid, v100.name, v100.generation) == (
        0,
        "GPU-aaa",
        "Tesla V100-SXM2-16GB",
        "v100",
    )
    assert (h100.generation, h100.memory_total_bytes, h100.simulated) == ("h100", 80 * GIB, False)

    s0, s1 = gpus.sample(set())
    assert (s0.utilization_pct, s0.memory_used_bytes, s0.temperature_c, s0.power_w) == (
        87.0,
        3 * GIB,
        66.0,
        250.5,
    )
    assert s0.time == 123.0 and s0.error is None
    assert s1.power_w is None  # NotSupported is a missing reading, not an error

    gpus.close()
    assert nvml.calls[-2:] == ["event_set_free", "shutdown"]


def test_nvml_counts_the_processes_holding_memory_on_some_gpus() -> None:
    # What decides whether a job still coming up may be frozen in place (docs/design.md §1.3).
    nvml = fake_machine()
    gpus = NvmlGpus(nvml)
    nvml.devices[1].compute_pids = (4242, 4343)
    assert gpus.compute_processes([0]) == 0
    assert gpus.compute_processes([1]) == 2 and gpus.compute_processes([0, 1]) == 2
    nvml.devices[1].lost = True
    assert gpus.compute_processes([1]) is None  # cannot tell: never frozen on its word
    assert SimulatedGpus("v100:2", node_id="n").compute_processes([0, 1]) == 0


def test_nvml_lost_gpu_is_reported_in_its_sample() -> None:
    nvml = fake_machine()
    gpus = NvmlGpus(nvml)
    nvml.devices[1].lost = True
    s0, s1 = gpus.sample(set())
    assert s0.error is None
    assert s1.error == "GPU is lost"
    assert s1.utilization_pct is None


def test_nvml_xid_events_are_polled_without_blocking() -> None:
    nvml = fake_machine()
    gpus = NvmlGpus(nvml, clock=lambda: 5.0)
    assert gpus.xid_supported == frozenset({0})  # the H100 refused registration: tolerated
    assert gpus.poll_xid_errors() == []
    nvml.pending_events += [(0, 0x8, 79), (0, 0x1, 0), (0, 0x8, 48)]
    errors = gpus.poll_xid_errors()
    assert [(e.index, e.uuid, e.xid, e.time) for e in errors] == [
        (0, "GPU-aaa", 79, 5.0),
        (0, "GPU-aaa", 48, 5.0),
    ]
    assert gpus.poll_xid_errors() == []


def test_nvml_without_event_support_still_works() -> None:
    nvml = fake_machine()
    nvml.event_set_supported = False
    gpus = NvmlGpus(nvml)
    assert gpus.xid_supported == frozenset()
    assert gpus.poll_xid_errors() == []
    assert len(gpus.sample(set())) == 2


def test_nvml_unavailable_tells_the_operator_to_simulate() -> None:
    nvml = FakeNvml(devices=[], init_error=NVMLError_LibraryNotFound())
    with pytest.raises(NoGpusError, match=r"NVML Shared Library Not Found.*--simulate-gpus"):
        open_gpus(None, nvml=nvml)


def test_nvml_with_no_devices_tells_the_operator_to_simulate() -> None:
    nvml = FakeNvml(devices=[])
    with pytest.raises(NoGpusError, match=r"no GPUs.*--simulate-gpus"):
        NvmlGpus(nvml)
    assert nvml.calls == ["init", "shutdown"]


def test_open_gpus_on_this_machine() -> None:
    # The real pynvml: without a driver (CI) the error must name the way out; with one, the
    # inventory must be real GPUs.
    try:
        gpus = open_gpus(None)
    except NoGpusError as exc:
        assert "--simulate-gpus" in str(exc)
        pynvml = importlib.import_module("pynvml")
        assert isinstance(exc.__cause__, pynvml.NVMLError)
    else:
        try:
            assert gpus.inventory()
            assert not any(g.simulated for g in gpus.inventory())
        finally:
            gpus.close()


def test_open_gpus_with_a_spec_simulates() -> None:
    gpus = open_gpus("k80:3", node_id="n")
    assert [g.generation for g in gpus.inventory()] == ["k80"] * 3


# ----- telemetry stream ------------------------------------------------------------------


async def test_telemetry_reports_follow_the_busy_callback() -> None:
    gpus = SimulatedGpus("v100:2")
    gpus.inject_xid(0, 31)
    busy_sets = iter([{0}, {0}, {1}])
    reports = []
    with anyio.fail_after(5):
        async for report in telemetry_reports(gpus, interval_s=0.01, busy=lambda: next(busy_sets)):
            reports.append(report)
            if len(reports) == 3:
                break
    utilization = [[s.utilization_pct or 0.0 for s in r.samples] for r in reports]
    assert [u[0] > 0 for u in utilization] == [True, True, False]
    assert [u[1] > 0 for u in utilization] == [False, False, True]
    assert [e.xid for e in reports[0].xid_errors] == [31]
    assert reports[1].xid_errors == ()


def test_the_local_cluster_is_one_server_of_this_machines_gpus() -> None:
    h200 = [FakeDevice("NVIDIA H200", f"GPU-{i}", memory_total=141 * GIB) for i in range(2)]
    nvml = FakeNvml(devices=h200)
    assert local_cluster_spec(nvml) == "h200:1x2"
    assert nvml.calls[-1] == "shutdown"  # the node's executor opens them itself


def test_a_local_cluster_of_several_generations_is_refused() -> None:
    mixed = [
        FakeDevice("NVIDIA H100 80GB HBM3", "GPU-0", memory_total=80 * GIB),
        FakeDevice("NVIDIA A100-SXM4-80GB", "GPU-1", memory_total=80 * GIB),
    ]
    with pytest.raises(NoGpusError, match=r"several generations \(a100, h100\)"):
        local_cluster_spec(FakeNvml(devices=mixed))
