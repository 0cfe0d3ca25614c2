"""The scheduler's instruments, the JSON Lines metric file, and which exporter config picks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from gfair.bus.metrics import GfairMetrics, JsonlMetricExporter, configure_metrics, metric_records
from gfair.bus.observability import ObservabilitySettings


def points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    """Metric name -> [(attributes, value or histogram count)]."""
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    for record in metric_records(data):
        value = record.get("value", record.get("count"))
        found.setdefault(record["name"], []).append((record["attributes"], value))
    return found


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def instruments(reader: InMemoryMetricReader) -> GfairMetrics:
    return GfairMetrics(MeterProvider(metric_readers=[reader]).get_meter("test"))


def test_shares_are_set_per_user_and_pool_and_a_departed_user_drops_to_zero(
    reader: InMemoryMetricReader, instruments: GfairMetrics
) -> None:
    instruments.record_shares(
        received={"alice": {"v100": 3.0}, "bob": {"v100": 1.0, "k80": 2.0}},
        entitled={"alice": {"v100": 2.0}, "bob": {"v100": 2.0}},
    )
    instruments.record_shares(received={"alice": {"v100": 4.0}}, entitled={"alice": {"v100": 4.0}})
    shares = {(a["user"], a["pool"], a["share"]): v for a, v in points(reader)["gfair.user.gpus"]}
    assert shares == {
        ("alice", "v100", "received"): 4.0,
        ("alice", "v100", "entitled"): 4.0,
        ("bob", "v100", "received"): 0.0,
        ("bob", "k80", "received"): 0.0,
        ("bob", "v100", "entitled"): 0.0,
    }


def test_quantum_counters_and_gauges_record_what_they_are_given(
    reader: InMemoryMetricReader, instruments: GfairMetrics
) -> None:
    instruments.record_quantum(0.004, waiting=3)
    instruments.record_quantum(0.2, waiting=1)
    instruments.suspends.add(1, {"node": "v100-0", "reason": "time_slice"})
    instruments.suspends.add(1, {"node": "v100-0", "reason": "time_slice"})
    instruments.failures.add(1, {"failure_class": "user_error", "decision": "retried"})
    instruments.gpu_utilization.set(0.5, {"node": "v100-0", "gpu": 1, "generation": "v100"})
    found = points(reader)
    assert found["gfair.jobs.waiting"] == [({}, 1)]
    assert found["gfair.quantum.decision.duration"] == [({}, 2)]
    assert found["gfair.job.suspends"] == [({"node": "v100-0", "reason": "time_slice"}, 2)]
    assert found["gfair.job.failures"] == [
        ({"failure_class": "user_error", "decision": "retried"}, 1)
    ]
    assert found["gfair.gpu.utilization"] == [
        ({"node": "v100-0", "gpu": 1, "generation": "v100"}, 0.5)
    ]


def test_the_jsonl_exporter_writes_one_flat_record_per_data_point(tmp_path: Path) -> None:
    path = tmp_path / "traces" / "metrics.jsonl"
    reader = PeriodicExportingMetricReader(
        JsonlMetricExporter(path), export_interval_millis=3_600_000
    )
    provider = MeterProvider(
        metric_readers=[reader], resource=Resource.create({"service.name": "split-stride"})
    )
    instruments = GfairMetrics(provider.get_meter("test"))
    instruments.record_quantum(0.003, waiting=2)
    instruments.trades.add(1, {"fast_pool": "v100", "slow_pool": "k80"})
    provider.shutdown()  # the final collection is exported on shutdown
    records = {r["name"]: r for r in map(json.loads, path.read_text().splitlines())}
    assert set(records) == {"gfair.jobs.waiting", "gfair.quantum.decision.duration", "gfair.trades"}
    assert records["gfair.jobs.waiting"]["value"] == 2
    assert records["gfair.jobs.waiting"]["service.name"] == "split-stride"
    histogram = records["gfair.quantum.decision.duration"]
    assert histogram["count"] == 1 and histogram["sum"] == pytest.approx(0.003)
    assert histogram["unit"] == "s" and 0.0025 in histogram["explicit_bounds"]
    assert sum(histogram["bucket_counts"]) == 1
    assert records["gfair.trades"]["attributes"] == {"fast_pool": "v100", "slow_pool": "k80"}


def test_metrics_go_where_the_settings_say(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "GFAIR_SPAN_FILE", "GFAIR_METRICS_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert ObservabilitySettings().chosen_metrics_exporter() == "none"
    assert configure_metrics("x", ObservabilitySettings(), set_global=False) is None
    spans = tmp_path / "traces" / "spans.jsonl"
    beside = ObservabilitySettings(span_file=spans)
    assert beside.chosen_metrics_exporter() == "jsonl"
    assert beside.metrics_path() == tmp_path / "traces" / "metrics.jsonl"
    own = ObservabilitySettings(span_file=spans, metrics_file=tmp_path / "m.jsonl")
    assert own.metrics_path() == tmp_path / "m.jsonl"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert ObservabilitySettings(span_file=spans).chosen_metrics_exporter() == "otlp"
    assert ObservabilitySettings(metrics_exporter="none").chosen_metrics_exporter() == "none"
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_ENDPOINT"):
        ObservabilitySettings(metrics_exporter="otlp").chosen_metrics_exporter()
    with pytest.raises(ValueError, match="GFAIR_METRICS_FILE"):
        ObservabilitySettings(metrics_exporter="jsonl").chosen_metrics_exporter()
    provider = configure_metrics("placement", beside, set_global=False)
    assert provider is not None
    GfairMetrics(provider.get_meter("test")).migrations.add(1, {"reason": "load_balance"})
    provider.shutdown()
    (record,) = map(json.loads, (tmp_path / "traces" / "metrics.jsonl").read_text().splitlines())
    assert (record["name"], record["value"], record["service.name"]) == (
        "gfair.job.migrations",
        1,
        "placement",
    )
