"""Finding a job's trace among all spans, in causal order; reading span files and Jaeger."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from gfair.traces import (
    AmbiguousJob,
    SpanFileError,
    SpanRecord,
    TraceNotFound,
    causal_order,
    find_job_trace,
    read_span_file,
)
from gfair.traces.jaeger import JaegerError, JaegerQuery

from .synthetic import ALL, LATER, T1, T1_ORDER, T2, jaeger_trace, span, write_span_file


@pytest.fixture
def span_file(tmp_path: Path) -> Path:
    return write_span_file(tmp_path / "traces" / "spans.jsonl")


def test_the_job_trace_is_the_one_its_submission_started_in_causal_order(
    span_file: Path,
) -> None:
    found = find_job_trace(read_span_file(span_file), "j1", user="alice")
    assert (found.user, found.job_id, found.trace_id) == ("alice", "j1", T1)
    assert tuple(s.span_id for s in found.spans) == T1_ORDER
    assert found.other_trace_ids == (T2,)
    assert found.services == {"placement", "failure-detector", "split-stride"}
    # Both submission spans hang off the tool's publish, which no file holds: both are roots.
    assert [s.service for s in found.roots()] == ["placement", "failure-detector"]
    assert (found.start_ns, found.end_ns) == (100_000_000, 115_000_000)
    document = found.to_json()
    assert document["trace_id"] == T1 and document["other_trace_ids"] == [T2]
    first = document["spans"][0]
    assert set(first) == {
        "span_id",
        "parent_span_id",
        "service",
        "name",
        "start_ns",
        "end_ns",
        "attributes",
    }
    assert (first["service"], first["name"]) == ("placement", "process gfair.job.submitted.v1")
    assert first["attributes"] == {"gfair.user": "alice", "gfair.job.id": "j1"}


def test_a_job_id_two_users_share_needs_the_user(span_file: Path) -> None:
    with pytest.raises(AmbiguousJob, match="alice, bob"):
        find_job_trace(read_span_file(span_file), "j1")
    bobs = find_job_trace(read_span_file(span_file), "j1", user="bob")
    assert bobs.user == "bob" and len(bobs.spans) == 1
    with pytest.raises(TraceNotFound, match="carol's job 'j1'"):
        find_job_trace(read_span_file(span_file), "j1", user="carol")
    with pytest.raises(TraceNotFound):
        find_job_trace(read_span_file(span_file), "nope")


def test_causal_order_puts_parents_first_even_against_the_clock() -> None:
    parent = span(T1, 1, None, "a", "parent", 10, 20)
    early_child = span(T1, 2, 1, "b", "child", 5, 6)  # host clock behind
    grandchild = span(T1, 3, 2, "c", "grandchild", 7, 8)
    sibling = span(T1, 4, None, "d", "later root", 11, 12)
    spans = list(read_lines([grandchild, sibling, early_child, parent]))
    assert [s.name for s in causal_order(spans)] == ["parent", "child", "grandchild", "later root"]
    assert [s.name for s in causal_order(spans + spans)] == [  # exported twice: listed once
        "parent",
        "child",
        "grandchild",
        "later root",
    ]


def read_lines(lines: list[dict[str, Any]]) -> Iterator[SpanRecord]:
    return (SpanRecord.from_span_file(line) for line in lines)


def test_a_line_being_written_is_skipped_and_a_broken_one_named(tmp_path: Path) -> None:
    path = write_span_file(tmp_path / "spans.jsonl")
    with path.open("a") as file:
        file.write('{"trace_id": "00')  # another process is halfway through its write
    assert len(list(read_span_file(path))) == len(ALL)
    broken = tmp_path / "broken.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = json.dumps({"trace_id": "xyz", "span_id": "1"})
    broken.write_text("\n".join(lines[:4]) + "\n")
    with pytest.raises(SpanFileError, match=r"broken.jsonl:3: not a span \(trace_id"):
        list(read_span_file(broken))
    with pytest.raises(SpanFileError, match="no span file"):
        list(read_span_file(tmp_path / "missing.jsonl"))


class FakeJaeger:
    """Jaeger's query API over a fixed set of traces, recording the searches it answers."""

    def __init__(self, traces: dict[str, list[dict[str, Any]]]) -> None:
        self.traces = traces
        self.searches: list[dict[str, list[str]]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path == "/api/services":
                    services = {s["service.name"] for t in fake.traces.values() for s in t}
                    return self._send({"data": sorted(services)})
                if url.path == "/api/traces":
                    query = parse_qs(url.query)
                    fake.searches.append(query)
                    wanted = json.loads(query["tags"][0])
                    hits = [
                        jaeger_trace(spans)
                        for spans in fake.traces.values()
                        if any(
                            s["service.name"] == query["service"][0]
                            and wanted.items() <= s["attributes"].items()
                            for s in spans
                        )
                    ]
                    return self._send({"data": hits})
                trace_id = url.path.removeprefix("/api/traces/")
                if trace_id in fake.traces:
                    return self._send({"data": [jaeger_trace(fake.traces[trace_id])]})
                self.send_error(404)

            def _send(self, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeJaeger:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def by_trace(lines: tuple[dict[str, Any], ...]) -> dict[str, list[dict[str, Any]]]:
    traces: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        traces.setdefault(line["trace_id"], []).append(line)
    return traces


def test_jaeger_gives_the_same_trace_as_the_span_file(span_file: Path) -> None:
    from_file = find_job_trace(read_span_file(span_file), "j1", user="alice")
    with FakeJaeger(by_trace(ALL)) as jaeger:
        from_jaeger = JaegerQuery(jaeger.url).find_job_trace("j1", user="alice")
        searched = {(q["service"][0], q["tags"][0]) for q in jaeger.searches}
    assert from_jaeger.trace_id == from_file.trace_id
    assert from_jaeger.other_trace_ids == from_file.other_trace_ids
    assert [s.to_json() for s in from_jaeger.spans] == [s.to_json() for s in from_file.spans]
    assert [s.kind for s in from_jaeger.spans][:2] == ["CONSUMER", "CONSUMER"]
    tags = json.dumps({"gfair.job.id": "j1", "gfair.user": "alice"})
    assert searched == {
        (service, tags) for service in ("failure-detector", "placement", "split-stride")
    }


def test_jaeger_errors_say_what_went_wrong() -> None:
    with FakeJaeger({LATER["trace_id"]: [LATER]}) as jaeger:
        with pytest.raises(TraceNotFound, match="no span naming job 'ghost'"):
            JaegerQuery(jaeger.url).find_job_trace("ghost")
        url = jaeger.url
    with pytest.raises(JaegerError, match="/api/services"):
        JaegerQuery(url, timeout_s=1.0).find_job_trace("j1")  # nobody listens any more
    with pytest.raises(ValueError, match="http"):
        JaegerQuery("file:///etc/passwd")
