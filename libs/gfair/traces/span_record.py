"""One finished span as gfair reads it back, whatever stored it.

The span file of the embedded mode (`gfair.bus.span_file`, JSON Lines, one span a line, every
service process appending) and Jaeger's query API both become `SpanRecord`s.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JOB_ID_ATTRIBUTE = "gfair.job.id"
USER_ATTRIBUTE = "gfair.user"


class SpanFileError(ValueError):
    """A span file that cannot be read: missing, or a line that is not a span."""


@dataclass(frozen=True, slots=True)
class SpanRecord:
    trace_id: str  # 32 lowercase hex digits
    span_id: str  # 16 lowercase hex digits
    parent_span_id: str | None
    service: str
    name: str
    start_ns: int
    end_ns: int
    kind: str = "INTERNAL"
    attributes: Mapping[str, Any] = field(default_factory=dict)
    status: str = "UNSET"

    @property
    def duration_ns(self) -> int:
        return max(self.end_ns - self.start_ns, 0)

    @property
    def job_id(self) -> str | None:
        value = self.attributes.get(JOB_ID_ATTRIBUTE)
        return value if isinstance(value, str) else None

    @property
    def user(self) -> str | None:
        value = self.attributes.get(USER_ATTRIBUTE)
        return value if isinstance(value, str) else None

    def to_json(self) -> dict[str, Any]:
        """The shape `gfair trace --json` prints for each span."""
        return {
            "span_id": self.span_id,
            "parent_span_id": self.parent_span_id,
            "service": self.service,
            "name": self.name,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "attributes": dict(self.attributes),
        }

    @classmethod
    def from_span_file(cls, line: Mapping[str, Any]) -> SpanRecord:
        """From one object of the span file (`gfair.bus.span_file.span_record`)."""
        status = line.get("status")
        return cls(
            trace_id=_hex_id(line["trace_id"], 32, "trace_id"),
            span_id=_hex_id(line["span_id"], 16, "span_id"),
            parent_span_id=(
                _hex_id(line["parent_span_id"], 16, "parent_span_id")
                if line.get("parent_span_id")
                else None
            ),
            service=str(line.get("service.name") or "unknown"),
            name=str(line["name"]),
            start_ns=int(line["start_ns"]),
            end_ns=int(line["end_ns"] if line.get("end_ns") is not None else line["start_ns"]),
            kind=str(line.get("kind") or "INTERNAL"),
            attributes=dict(line.get("attributes") or {}),
            status=str(status.get("code", "UNSET")) if isinstance(status, Mapping) else "UNSET",
        )


def _hex_id(value: object, digits: int, name: str) -> str:
    text = str(value).lower()
    if len(text) != digits or any(c not in "0123456789abcdef" for c in text):
        raise ValueError(f"{name}: {value!r} is not {digits} hex digits")
    return text


def read_span_file(path: Path) -> Iterator[SpanRecord]:
    """The spans of a JSON Lines span file, in file order.

    A last line without its newline is one a process is still writing: it is skipped. Any
    other line that is not a span is an error naming the file and line.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpanFileError(f"no span file at {path}") from None
    except OSError as exc:
        raise SpanFileError(f"cannot read span file {path}: {exc}") from exc
    lines = text.split("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield SpanRecord.from_span_file(json.loads(line))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            if number == len(lines):  # no newline after it yet: being appended right now
                return
            what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise SpanFileError(f"{path}:{number}: not a span ({what})") from exc
