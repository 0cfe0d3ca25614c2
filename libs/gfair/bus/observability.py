"""One call per process to set up traces, metrics and logs from configuration.

Traces go to an OTLP/HTTP collector (`OTEL_EXPORTER_OTLP_ENDPOINT`), to a local JSON Lines
file (embedded mode: `GFAIR_SPAN_FILE`), or nowhere. With `GFAIR_TRACES_EXPORTER=auto` (the
default) the collector wins when configured, then the file, then none. Metrics
(`gfair.bus.metrics`) follow the same rule (`GFAIR_METRICS_EXPORTER`): the collector, else
`GFAIR_METRICS_FILE` (default: ``metrics.jsonl`` beside the span file), else none.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Tracer
from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gfair.bus.logs import LogFormat, configure_logging
from gfair.bus.metrics import PrometheusEndpoint, configure_metrics
from gfair.bus.span_file import JsonlSpanExporter
from gfair.bus.tracing import TRACER_NAME

TracesExporter = Literal["auto", "otlp", "jsonl", "none"]
MetricsExporter = TracesExporter


class ObservabilitySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

    traces_exporter: TracesExporter = "auto"
    otlp_endpoint: str | None = Field(
        default=None,
        validation_alias=AliasChoices("GFAIR_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"),
        description="Base URL of an OTLP/HTTP collector, e.g. http://localhost:4318",
    )
    span_file: Path | None = Field(default=None, description="JSON Lines file for spans")
    metrics_exporter: MetricsExporter = "auto"
    metrics_file: Path | None = Field(
        default=None, description="JSON Lines file for metrics (default: beside the span file)"
    )
    metrics_interval_s: float = Field(default=10.0, gt=0, description="Metrics export period")
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port)",
    )
    # Loopback unless the operator opens it: the endpoint has no authentication, and a job
    # runs on the same machine (in compose, in the executor's network namespace).
    metrics_host: str = Field(default="127.0.0.1", description="Address the metrics port binds")
    log_level: str = "INFO"
    log_format: LogFormat = "json"

    def metrics_path(self) -> Path | None:
        if self.metrics_file is not None:
            return self.metrics_file
        return self.span_file.with_name("metrics.jsonl") if self.span_file is not None else None

    def chosen_metrics_exporter(self) -> Literal["otlp", "jsonl", "none"]:
        if self.metrics_exporter == "otlp" and not self.otlp_endpoint:
            raise ValueError("metrics_exporter=otlp needs OTEL_EXPORTER_OTLP_ENDPOINT")
        if self.metrics_exporter == "jsonl" and self.metrics_path() is None:
            raise ValueError("metrics_exporter=jsonl needs GFAIR_METRICS_FILE or GFAIR_SPAN_FILE")
        if self.metrics_exporter != "auto":
            return self.metrics_exporter
        if self.otlp_endpoint:
            return "otlp"
        return "jsonl" if self.metrics_path() is not None else "none"

    def chosen_exporter(self) -> Literal["otlp", "jsonl", "none"]:
        if self.traces_exporter == "otlp" and not self.otlp_endpoint:
            raise ValueError("traces_exporter=otlp needs OTEL_EXPORTER_OTLP_ENDPOINT")
        if self.traces_exporter == "jsonl" and self.span_file is None:
            raise ValueError("traces_exporter=jsonl needs GFAIR_SPAN_FILE")
        if self.traces_exporter != "auto":
            return self.traces_exporter
        if self.otlp_endpoint:
            return "otlp"
        return "jsonl" if self.span_file is not None else "none"


@dataclass
class Observability:
    tracer: Tracer
    provider: TracerProvider | None
    meter_provider: MeterProvider | None = None
    metrics_endpoint: PrometheusEndpoint | None = None

    def shutdown(self) -> None:
        """Flush and close the exporters; call once at process exit."""
        if self.provider is not None:
            self.provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()


def _exporter(settings: ObservabilitySettings) -> SpanExporter | None:
    match settings.chosen_exporter():
        case "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            assert settings.otlp_endpoint is not None
            return OTLPSpanExporter(endpoint=settings.otlp_endpoint.rstrip("/") + "/v1/traces")
        case "jsonl":
            assert settings.span_file is not None
            return JsonlSpanExporter(settings.span_file)
        case _:
            return None


def configure_observability(
    service_name: str,
    settings: ObservabilitySettings | None = None,
    *,
    set_global: bool = True,
) -> Observability:
    """Configure logs and the tracer provider for a process named `service_name`."""
    settings = settings or ObservabilitySettings()
    configure_logging(service_name, level=settings.log_level, fmt=settings.log_format)
    endpoint = None
    if settings.metrics_port is not None:
        try:
            endpoint = PrometheusEndpoint(settings.metrics_port, settings.metrics_host)
        except OSError as exc:
            # Metrics are for watching the scheduler; a port taken (several processes given
            # the same GFAIR_METRICS_PORT) must not stop it from scheduling.
            structlog.get_logger("gfair.observability").error(
                "cannot serve metrics",
                port=settings.metrics_port,
                host=settings.metrics_host,
                error=str(exc),
            )
    meter_provider = configure_metrics(
        service_name,
        settings,
        set_global=set_global,
        readers=[endpoint.reader] if endpoint is not None else [],
    )
    exporter = _exporter(settings)
    if exporter is None:
        return Observability(
            tracer=trace.get_tracer(TRACER_NAME),
            provider=None,
            meter_provider=meter_provider,
            metrics_endpoint=endpoint,
        )
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name, "service.namespace": "gfair"})
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    if set_global:
        trace.set_tracer_provider(provider)
    return Observability(
        tracer=provider.get_tracer(TRACER_NAME),
        provider=provider,
        meter_provider=meter_provider,
        metrics_endpoint=endpoint,
    )
