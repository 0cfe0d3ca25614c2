"""The scheduler's metrics: every instrument in one place, and where they are exported.

Services record through `gfair_metrics()`; `configure_metrics` (called by
`configure_observability`, so by every service process) decides where the numbers go: an
OTLP/HTTP collector when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, else a JSON Lines file
(`GFAIR_METRICS_FILE`, by default ``metrics.jsonl`` beside the span file of the embedded
mode), else nowhere; and, with `GFAIR_METRICS_PORT`, also a Prometheus endpoint
(``http://HOST:PORT/metrics``, `PrometheusEndpoint`) for Prometheus to scrape. Until a process
configures a provider the instruments are no-ops, so unit tests and tools pay nothing.

In Prometheus a name's dots become underscores, a unit in braces is dropped, ``s`` becomes
``_seconds``, and counters end in ``_total`` (`gfair.job.suspends` is
``gfair_job_suspends_total``); `deploy/grafana/dashboards/gfair.json` queries those names.

| instrument | kind | attributes | recorded by |
|---|---|---|---|
| ``gfair.jobs.waiting`` | gauge | | split-stride, each quantum |
| ``gfair.user.gpus`` | gauge | user, pool, share=received/entitled | split-stride |
| ``gfair.quantum.decision.duration`` | histogram (s) | | split-stride |
| ``gfair.gpu.utilization`` | gauge (0..1) | node, gpu, generation | node-executor |
| ``gfair.job.suspends`` | counter | node, reason | node-executor (``migration``: a move) |
| ``gfair.job.migrations`` | counter | node, reason | node-executor, on a migrate command |
| ``gfair.trades`` | counter | fast_pool, slow_pool | trading-auction |
| ``gfair.job.failures`` | counter | failure_class, decision=retried/failed | failure-detector |
| ``gfair.node.gpus.busy`` | gauge | node, generation | node-executor (GPUs running a job) |
| ``gfair.handler.duration`` | histogram (s) | service, handler | every service, per event |
| ``gfair.dead_letters`` | counter | service, stream, reason | every service |

Counters count what a service did, so an event handled twice after a crash may count twice:
these are operational signals, the streams stay the record.

Each counter is exported from 0 (`export_from_zero`) by the service that counts it, for the
attribute values it knows when it starts (the reasons' enums, its node, its streams; the
auction's pool pairs once it knows the pools), so an idle panel shows 0 rather than "No data".
A histogram cannot be: the API has no way to export one series without an observation, so
each appears with its first one (a quantum, an event handled).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics
from opentelemetry.metrics import Counter, Meter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    NumberDataPoint,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

if TYPE_CHECKING:
    from gfair.bus.observability import ObservabilitySettings

METER_NAME = "gfair"

# Quantum decisions take milliseconds at demo scale and tens of ms at 1k servers
# (docs/design.md §5).
_DECISION_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# Handlers take well under a millisecond to seconds (a start command waits for the process).
_HANDLER_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

Shares = Mapping[str, Mapping[str, float]]  # user -> pool -> GPUs


class GfairMetrics:
    """The instruments, made from one meter."""

    def __init__(self, meter: Meter) -> None:
        self.jobs_waiting = meter.create_gauge(
            "gfair.jobs.waiting",
            unit="{job}",
            description="Runnable jobs that hold no GPUs after the quantum's decision",
        )
        self.user_gpus = meter.create_gauge(
            "gfair.user.gpus",
            unit="{gpu}",
            description="GPUs of a pool a user holds now (share=received) or is entitled to "
            "(share=entitled)",
        )
        self.quantum_decision = meter.create_histogram(
            "gfair.quantum.decision.duration",
            unit="s",
            description="Time to decide one quantum for the whole cluster",
            explicit_bucket_boundaries_advisory=list(_DECISION_BUCKETS_S),
        )
        self.gpu_utilization = meter.create_gauge(
            "gfair.gpu.utilization",
            unit="1",
            description="Utilization of one GPU, 0 to 1, as its node last sampled it",
        )
        self.suspends = meter.create_counter(
            "gfair.job.suspends", unit="{suspend}", description="Jobs checkpointed and stopped"
        )
        self.migrations = meter.create_counter(
            "gfair.job.migrations",
            unit="{migration}",
            description="Jobs that left a node to run on another",
        )
        self.trades = meter.create_counter(
            "gfair.trades", unit="{trade}", description="Trades cleared by the auction"
        )
        self.failures = meter.create_counter(
            "gfair.job.failures",
            unit="{failure}",
            description="Job exits classified as failures, by class and what was decided",
        )
        self.gpus_busy = meter.create_gauge(
            "gfair.node.gpus.busy",
            unit="{gpu}",
            description="GPUs of a node running a job's process, per generation",
        )
        self.handler_duration = meter.create_histogram(
            "gfair.handler.duration",
            unit="s",
            description="Time a service's handler took for one event",
            explicit_bucket_boundaries_advisory=list(_HANDLER_BUCKETS_S),
        )
        self.dead_letters = meter.create_counter(
            "gfair.dead_letters",
            unit="{message}",
            description="Messages parked on gfair.dlq.<stream>, by the reason",
        )
        self.queries_refused = meter.create_counter(
            "gfair.queries.refused",
            unit="{question}",
            description="Questions the query service did not answer: a reply subject that is "
            "not the asker's inbox (dropped), or the asker's queue full (told so)",
        )
        self._shares_seen: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def record_quantum(self, decision_s: float, waiting: int) -> None:
        self.quantum_decision.record(decision_s)
        self.jobs_waiting.set(waiting)

    def record_shares(self, received: Shares, entitled: Shares) -> None:
        """Every user's GPUs per pool, held and entitled; a user gone since the last call
        is set to 0 (a gauge otherwise repeats its last value forever)."""
        points = {
            (user, pool, share): float(gpus)
            for share, table in (("received", received), ("entitled", entitled))
            for user, pools in table.items()
            for pool, gpus in pools.items()
        }
        with self._lock:
            gone = self._shares_seen - points.keys()
            self._shares_seen = set(points)
        for key in gone:
            points[key] = 0.0
        for (user, pool, share), gpus in points.items():
            self.user_gpus.set(gpus, {"user": user, "pool": pool, "share": share})


def export_from_zero(counter: Counter, attribute_sets: Iterable[Mapping[str, str]]) -> None:
    """Export `counter`'s series for each of `attribute_sets` now, at 0: a counter's series
    otherwise appears only with its first increment, and a rate over nothing is no data.
    Adding 0 counts nothing, so calling this again (after a restart, say) changes nothing."""
    for attributes in attribute_sets:
        counter.add(0, attributes)


_global: GfairMetrics | None = None
_global_lock = threading.Lock()


def gfair_metrics() -> GfairMetrics:
    """The process's instruments, on the global meter provider (no-ops until one is set)."""
    global _global
    with _global_lock:
        if _global is None:
            # The API's proxy meter forwards to the provider configured later.
            _global = GfairMetrics(metrics.get_meter(METER_NAME))
        return _global


def _attributes(values: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in (values or {}).items()}


def metric_records(data: MetricsData) -> Iterator[dict[str, Any]]:
    """One flat JSON-ready record per data point: easy to grep, plot or load into a frame."""
    for resource_metrics in data.resource_metrics:
        service = resource_metrics.resource.attributes.get("service.name")
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    record: dict[str, Any] = {
                        "time_ns": point.time_unix_nano,
                        "service.name": service,
                        "name": metric.name,
                        "unit": metric.unit,
                        "attributes": _attributes(point.attributes),
                    }
                    if isinstance(point, NumberDataPoint):
                        record["value"] = point.value
                    elif isinstance(point, HistogramDataPoint):
                        record.update(
                            count=point.count,
                            sum=point.sum,
                            min=point.min,
                            max=point.max,
                            bucket_counts=list(point.bucket_counts),
                            explicit_bounds=list(point.explicit_bounds),
                        )
                    else:  # exponential histograms are never configured here
                        continue
                    yield record


class JsonlMetricExporter(MetricExporter):
    """Appends one JSON object per data point to a file, as `JsonlSpanExporter` does spans."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self._path

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        lines = "".join(
            json.dumps(record, separators=(",", ":")) + "\n"
            for record in metric_records(metrics_data)
        )
        if not lines:
            return MetricExportResult.SUCCESS
        try:
            with self._lock:
                # One O_APPEND write: lines of several processes never interleave.
                fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, lines.encode())
                finally:
                    os.close(fd)
        except OSError:
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


class PrometheusEndpoint:
    """``http://HOST:PORT/metrics`` serving this process's metrics in Prometheus' text format.

    Read at each scrape (no export period); its own registry, so several in one process (tests)
    do not see each other's metrics.
    """

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import CollectorRegistry, start_http_server

        self._registry = CollectorRegistry(auto_describe=True)
        self.reader = PrometheusMetricReader(registry=self._registry)
        self._server, self._thread = start_http_server(port, host, registry=self._registry)
        self.port = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def metric_exporter(settings: ObservabilitySettings) -> MetricExporter | None:
    match settings.chosen_metrics_exporter():
        case "otlp":
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )

            assert settings.otlp_endpoint is not None
            return OTLPMetricExporter(endpoint=settings.otlp_endpoint.rstrip("/") + "/v1/metrics")
        case "jsonl":
            path = settings.metrics_path()
            assert path is not None
            return JsonlMetricExporter(path)
        case _:
            return None


def configure_metrics(
    service_name: str,
    settings: ObservabilitySettings,
    *,
    set_global: bool = True,
    readers: Sequence[MetricReader] = (),
) -> MeterProvider | None:
    """A meter provider exporting as `settings` say, every `metrics_interval_s`, and read by
    `readers` (a `PrometheusEndpoint`'s); None when metrics go nowhere. With `set_global`,
    `gfair_metrics()` records into it."""
    exporter = metric_exporter(settings)
    all_readers = list(readers)
    if exporter is not None:
        all_readers.append(
            PeriodicExportingMetricReader(
                exporter, export_interval_millis=settings.metrics_interval_s * 1000
            )
        )
    if not all_readers:
        return None
    provider = MeterProvider(
        metric_readers=all_readers,
        resource=Resource.create({"service.name": service_name, "service.namespace": "gfair"}),
    )
    if set_global:
        metrics.set_meter_provider(provider)
    return provider
