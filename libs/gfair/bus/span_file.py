"""A span exporter appending one JSON object per finished span to a file (JSON Lines).

For the embedded mode (`gfair up` without a collector): every service process appends to the
same file, one line per span, written whole with a single `write` so lines from several
processes do not interleave.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pydantic_core
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.util.types import AttributeValue


def _attribute(value: AttributeValue) -> Any:
    return list(value) if isinstance(value, tuple) else value


def span_record(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None, "a finished SDK span always has a context"
    parent = span.parent
    return {
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_span_id": f"{parent.span_id:016x}" if parent is not None else None,
        "name": span.name,
        "kind": span.kind.name,
        "service.name": span.resource.attributes.get("service.name"),
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "attributes": {k: _attribute(v) for k, v in (span.attributes or {}).items()},
        "status": {"code": span.status.status_code.name, "description": span.status.description},
        "events": [
            {
                "name": event.name,
                "time_ns": event.timestamp,
                "attributes": {k: _attribute(v) for k, v in (event.attributes or {}).items()},
            }
            for event in span.events
        ],
    }


class JsonlSpanExporter(SpanExporter):
    def __init__(self, path: Path) -> None:
        self._path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._closed = False

    @property
    def path(self) -> Path:
        return self._path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        # Every handled and published event makes a span: pydantic's encoder (compact, UTF-8)
        # costs a sixth of `json.dumps`, in a thread that shares the service's interpreter.
        lines = b"".join(pydantic_core.to_json(span_record(s)) + b"\n" for s in spans)
        try:
            with self._lock:
                # O_APPEND makes each write land at the end even with other writers.
                fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, lines)
                finally:
                    os.close(fd)
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._closed = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
