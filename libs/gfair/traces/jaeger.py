"""Reading a job's trace from Jaeger's query API (the compose deployment's trace store).

    GET /api/services                                  -> the services that sent spans
    GET /api/traces?service=S&tags={"gfair.job.id":J}  -> traces with a span of S naming J
    GET /api/traces/{trace_id}                         -> one whole trace

Jaeger's search needs a service; every known service is searched, since the submission's
span may have been dropped by sampling in one of them. Times are microseconds in Jaeger.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

from gfair.traces.job_trace import JobTrace, TraceNotFound, causal_order, find_job_trace
from gfair.traces.span_record import JOB_ID_ATTRIBUTE, USER_ATTRIBUTE, SpanRecord

DEFAULT_LOOKBACK_S = 7 * 24 * 3600.0


class JaegerError(RuntimeError):
    """Jaeger did not answer, or answered something that is not its query API."""


def jaeger_spans(trace: Mapping[str, Any]) -> Iterator[SpanRecord]:
    """The spans of one trace object of Jaeger's JSON (`data[i]`)."""
    processes = trace.get("processes") or {}
    for span in trace.get("spans") or []:
        tags = {tag["key"]: tag.get("value") for tag in span.get("tags") or []}
        parent = next(
            (
                ref["spanID"]
                for ref in span.get("references") or []
                if ref.get("refType") == "CHILD_OF" and ref.get("traceID") == span["traceID"]
            ),
            None,
        )
        process = processes.get(span.get("processID"), {})
        start_ns = int(span["startTime"]) * 1000
        status = str(tags.pop("otel.status_code", "UNSET")).upper()
        kind = str(tags.pop("span.kind", "internal")).upper()
        yield SpanRecord(
            trace_id=str(span["traceID"]).lower().zfill(32),
            span_id=str(span["spanID"]).lower().zfill(16),
            parent_span_id=str(parent).lower().zfill(16) if parent else None,
            service=str(process.get("serviceName") or "unknown"),
            name=str(span["operationName"]),
            start_ns=start_ns,
            end_ns=start_ns + int(span.get("duration", 0)) * 1000,
            kind=kind,
            attributes=tags,
            status=status,
        )


class JaegerQuery:
    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 10.0,
        lookback_s: float = DEFAULT_LOOKBACK_S,
        limit: int = 20,
    ) -> None:
        if urllib.parse.urlsplit(base_url).scheme not in ("http", "https"):
            raise ValueError(f"Jaeger URL {base_url!r}: expected http:// or https://")
        self._base = base_url.rstrip("/")
        self._timeout_s = timeout_s
        self._lookback_s = lookback_s
        self._limit = limit

    def _get(self, path: str, query: Mapping[str, str] | None = None) -> Any:
        url = f"{self._base}{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        try:
            with urllib.request.urlopen(url, timeout=self._timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise JaegerError(f"GET {url}: HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise JaegerError(f"GET {url}: {exc}") from exc
        try:
            return json.loads(body)
        except ValueError as exc:
            raise JaegerError(f"GET {url}: not JSON ({exc})") from exc

    def services(self) -> list[str]:
        answer = self._get("/api/services")
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list):
            raise JaegerError(f"{self._base}/api/services: no service list in the answer")
        return sorted(str(name) for name in data)

    def search(self, service: str, tags: Mapping[str, str]) -> list[SpanRecord]:
        """Spans of every trace where `service` has a span with these tags."""
        now_us = int(time.time() * 1e6)
        answer = self._get(
            "/api/traces",
            {
                "service": service,
                "tags": json.dumps(dict(tags)),
                "limit": str(self._limit),
                "start": str(now_us - int(self._lookback_s * 1e6)),
                "end": str(now_us),
            },
        )
        return [span for trace in _traces(answer) for span in jaeger_spans(trace)]

    def trace(self, trace_id: str) -> list[SpanRecord]:
        answer = self._get(f"/api/traces/{trace_id}")
        return [span for trace in _traces(answer) for span in jaeger_spans(trace)]

    def find_job_trace(self, job_id: str, user: str | None = None) -> JobTrace:
        tags = {JOB_ID_ATTRIBUTE: job_id}
        if user is not None:
            tags[USER_ATTRIBUTE] = user
        found: dict[tuple[str, str], SpanRecord] = {}
        for service in self.services():
            for span in self.search(service, tags):
                found[(span.trace_id, span.span_id)] = span
        if not found:
            raise TraceNotFound(f"Jaeger at {self._base} has no span naming job {job_id!r}")
        located = find_job_trace(found.values(), job_id, user)
        # A search answer may hold part of a trace (Jaeger limits); read the whole one.
        whole = self.trace(located.trace_id) or list(located.spans)
        return JobTrace(
            user=located.user,
            job_id=job_id,
            trace_id=located.trace_id,
            spans=tuple(causal_order(whole)),
            other_trace_ids=located.other_trace_ids,
        )


def _traces(answer: Any) -> list[Mapping[str, Any]]:
    if answer is None:
        return []
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        raise JaegerError("the answer has no trace list (is this Jaeger's query API?)")
    return [trace for trace in data if isinstance(trace, dict)]
