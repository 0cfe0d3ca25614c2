"""A synthetic span file: alice's job j1 over two traces, bob's j1, and an unrelated trace.

Trace T1 is j1's life: placement handles the submission, announces acceptance and placement,
which split-stride handles (its clock runs early: it seems to start before its parent). The
failure detector's handling of the submission, like placement's, hangs off the tool's
publish, which no file holds.
T2 is a later, separate trace that also names j1 (a start not yet joined to the job's trace).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

T1, T2, T3, T4 = (f"{n:032x}" for n in (0xA1, 0xA2, 0xB1, 0xC1))
ALICE = {"gfair.user": "alice", "gfair.job.id": "j1"}
BOB = {"gfair.user": "bob", "gfair.job.id": "j1"}
MS = 1_000_000


def span(
    trace_id: str,
    span_id: int,
    parent: int | None,
    service: str,
    name: str,
    start_ms: int,
    end_ms: int,
    attributes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One line of the span file, as `gfair.bus.span_file.span_record` writes it."""
    return {
        "trace_id": trace_id,
        "span_id": f"{span_id:016x}",
        "parent_span_id": f"{parent:016x}" if parent is not None else None,
        "name": name,
        "kind": "CONSUMER" if name.startswith("process") else "PRODUCER",
        "service.name": service,
        "start_ns": start_ms * MS,
        "end_ns": end_ms * MS,
        "attributes": dict(attributes or {}),
        "status": {"code": "UNSET", "description": None},
        "events": [],
    }


SUBMITTED = span(T1, 0x10, 0xDEAD, "placement", "process gfair.job.submitted.v1", 100, 108, ALICE)
DETECTED = span(
    T1, 0x11, 0xDEAD, "failure-detector", "process gfair.job.submitted.v1", 101, 103, ALICE
)
ACCEPTED = span(T1, 0x12, 0x10, "placement", "publish gfair.job.accepted.v1", 102, 104, ALICE)
PLACED = span(
    T1,
    0x13,
    0x10,
    "placement",
    "publish gfair.job.placed.v1",
    110,
    112,
    {**ALICE, "gfair.servers": ["v100-0"], "gfair.generation": "v100"},
)
SPLIT = span(T1, 0x14, 0x13, "split-stride", "process gfair.job.placed.v1", 105, 115, ALICE)
LATER = span(T2, 0x20, None, "split-stride", "publish gfair.cmd.start.v1", 500, 501, ALICE)
BOBS = span(T3, 0x30, None, "placement", "process gfair.job.submitted.v1", 50, 51, BOB)
OTHER = span(T4, 0x40, None, "split-stride", "split_stride.quantum", 90, 91)

ALL = (OTHER, BOBS, SUBMITTED, DETECTED, SPLIT, PLACED, ACCEPTED, LATER)
# Causal order of T1: the roots by start, then what each makes ready, earliest first; the
# split-stride span comes after its parent although its clock says it started earlier.
T1_ORDER = ("0000000000000010", "0000000000000011", "0000000000000012", "0000000000000013")
T1_ORDER += ("0000000000000014",)


def write_span_file(path: Path, lines: tuple[dict[str, Any], ...] = ALL) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def jaeger_trace(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The same spans as Jaeger's query API returns a trace (microseconds, tags, processes)."""
    services = sorted({line["service.name"] for line in lines})
    process_of = {service: f"p{i}" for i, service in enumerate(services)}
    spans = []
    for line in lines:
        references = (
            [{"refType": "CHILD_OF", "traceID": line["trace_id"], "spanID": line["parent_span_id"]}]
            if line["parent_span_id"]
            else []
        )
        tags = [
            {"key": key, "type": "string", "value": value}
            for key, value in line["attributes"].items()
        ]
        tags.append({"key": "span.kind", "type": "string", "value": line["kind"].lower()})
        spans.append(
            {
                "traceID": line["trace_id"],
                "spanID": line["span_id"],
                "operationName": line["name"],
                "references": references,
                "startTime": line["start_ns"] // 1000,
                "duration": (line["end_ns"] - line["start_ns"]) // 1000,
                "tags": tags,
                "processID": process_of[line["service.name"]],
            }
        )
    return {
        "traceID": lines[0]["trace_id"],
        "spans": spans,
        "processes": {pid: {"serviceName": service} for service, pid in process_of.items()},
    }
