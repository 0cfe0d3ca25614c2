"""An OTLP/HTTP collector for tests: accepts POST /v1/traces and /v1/metrics (protobuf) on
127.0.0.1, keeps what it got, and decodes it with `opentelemetry.proto`."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from gfair.traces import SpanRecord

_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
_STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(value, kind)
    return None  # bytes and key-value lists: gfair sets neither


class OtlpSink:
    def __init__(self) -> None:
        self.requests: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                with sink._lock:
                    sink.requests.append((self.path, body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OtlpSink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _bodies(self, path: str) -> list[bytes]:
        with self._lock:
            return [body for got, body in self.requests if got == path]

    def spans(self) -> list[SpanRecord]:
        """Every span received, as gfair reads spans back."""
        found = []
        for body in self._bodies("/v1/traces"):
            request = ExportTraceServiceRequest.FromString(body)
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        found.append(
                            SpanRecord(
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex() or None,
                                service=str(resource.get("service.name", "unknown")),
                                name=span.name,
                                start_ns=span.start_time_unix_nano,
                                end_ns=span.end_time_unix_nano,
                                kind=_KINDS.get(span.kind, "UNSPECIFIED"),
                                attributes={a.key: _value(a.value) for a in span.attributes},
                                status=_STATUS.get(span.status.code, "UNSET"),
                            )
                        )
        return found

    def metric_names(self) -> dict[str, set[str]]:
        """Service name -> names of the metrics it exported."""
        found: dict[str, set[str]] = {}
        for body in self._bodies("/v1/metrics"):
            request = ExportMetricsServiceRequest.FromString(body)
            for resource_metrics in request.resource_metrics:
                resource = {a.key: _value(a.value) for a in resource_metrics.resource.attributes}
                names = found.setdefault(str(resource.get("service.name")), set())
                for scope in resource_metrics.scope_metrics:
                    names.update(metric.name for metric in scope.metrics)
        return found
