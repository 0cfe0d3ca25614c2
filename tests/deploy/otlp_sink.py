"""An OTLP/HTTP collector for tests: accepts POST /v1/traces and /v1/metrics (protobuf) on
127.0.0.1, keeps what it got, and decodes it with `opentelemetry.proto`.

Run as a program it stands in for the compose deployment's collector (the official image
cannot be pulled where the tests run; tests/docker/compose.otlp-sink.yaml runs this file in
the gfair image): it listens on --host/--port and appends every span it receives to
--span-file, in the span file's format, which `gfair trace --span-file` reads.

    python otlp_sink.py --host 0.0.0.0 --port 4318 --span-file /spans/spans.jsonl
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
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
    """Keeps every request; with `span_file`, appends each request's spans to it instead."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, span_file: Path | None = None
    ) -> None:
        self.requests: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                with sink._lock:
                    if span_file is None:
                        sink.requests.append((self.path, body))
                    elif self.path == "/v1/traces":
                        _append(span_file, decode_spans(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def serve_forever(self) -> None:
        self._server.serve_forever()

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
        return [span for body in self._bodies("/v1/traces") for span in decode_spans(body)]

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


def decode_spans(body: bytes) -> list[SpanRecord]:
    """The spans of one OTLP/HTTP trace export, as gfair reads spans back."""
    found = []
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


def span_file_line(span: SpanRecord) -> dict[str, Any]:
    """`span` as a line of the span file (`gfair.bus.span_file.span_record`'s fields)."""
    return {
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "parent_span_id": span.parent_span_id,
        "name": span.name,
        "kind": span.kind,
        "service.name": span.service,
        "start_ns": span.start_ns,
        "end_ns": span.end_ns,
        "attributes": dict(span.attributes),
        "status": {"code": span.status},
    }


def _append(path: Path, spans: Sequence[SpanRecord]) -> None:
    text = "".join(json.dumps(span_file_line(s), separators=(",", ":")) + "\n" for s in spans)
    if not text:
        return
    # One O_APPEND write a request: a reader never sees half of a request's lines but the last.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="an OTLP/HTTP sink writing a span file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4318)
    parser.add_argument("--span-file", type=Path, required=True)
    args = parser.parse_args(argv)
    sink = OtlpSink(args.host, args.port, args.span_file)
    # As a container's first process, SIGTERM (`docker compose down`) would otherwise be
    # ignored until the engine's SIGKILL.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"otlp sink: listening on {args.host}:{args.port}, spans to {args.span_file}")
    sys.stdout.flush()
    sink.serve_forever()


if __name__ == "__main__":
    main()
