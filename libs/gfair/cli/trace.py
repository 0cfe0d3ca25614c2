"""`gfair trace JOB`: a job's whole life as one trace, as a tree with timings.

Spans come from the span file of the embedded mode (`--span-file`, else ``$GFAIR_SPAN_FILE``,
else that of a running `gfair up`, else the newest ``.gfair/**/traces/spans.jsonl`` below the
current directory) or from
Jaeger's query API (`--jaeger URL` or ``$GFAIR_JAEGER_URL``, e.g. http://localhost:16686).

`--json` prints ``{"trace_id", "user", "job_id", "spans": [{"span_id", "parent_span_id",
"service", "name", "start_ns", "end_ns", "attributes"}], "other_trace_ids"}`` with the
spans in causal order (parents before children, then by start time).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.tree import Tree

from gfair.cli import output, session
from gfair.cli.arguments import add_command
from gfair.client.cluster_context import context_paths, running_context
from gfair.traces.jaeger import JaegerError, JaegerQuery
from gfair.traces.job_trace import AmbiguousJob, JobTrace, TraceNotFound, find_job_trace
from gfair.traces.span_record import SpanFileError, SpanRecord, read_span_file

SPAN_FILE_ENV = "GFAIR_SPAN_FILE"
JAEGER_URL_ENV = "GFAIR_JAEGER_URL"

# Attributes worth a place on a tree line; the job's own id and user are in the title.
_SHOWN = (
    "gfair.node",
    "gfair.servers",
    "gfair.to_node",
    "gfair.gpus",
    "gfair.generation",
    "gfair.attempt",
    "gfair.quantum",
    "gfair.reason",
    "gfair.failure_class",
    "gfair.run.end",
    "gfair.exit_code",
    "gfair.checkpoint_step",
    "gfair.outcome",
)
_SERVICE_STYLES = (
    "cyan",
    "magenta",
    "green",
    "yellow",
    "blue",
    "red",
    "bright_cyan",
    "bright_magenta",
)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = add_command(subparsers, "trace", __doc__)
    parser.add_argument("job", metavar="JOB", help="JOB, or USER/JOB")
    session.add_user_flag(parser)
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--span-file",
        type=Path,
        metavar="PATH",
        help=f"JSON Lines span file (default: ${SPAN_FILE_ENV}, else the newest "
        ".gfair/**/traces/spans.jsonl)",
    )
    source.add_argument(
        "--jaeger",
        metavar="URL",
        help=f"Jaeger query endpoint, e.g. http://localhost:16686 (default: ${JAEGER_URL_ENV})",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a tree")
    parser.set_defaults(func=_trace)


def default_span_file(root: Path | None = None) -> Path | None:
    """``$GFAIR_SPAN_FILE``, else a running `gfair up`'s, else the newest one under `root`.

    The newest one is the most recently written ``.gfair/**/traces/spans.jsonl``.
    """
    configured = os.environ.get(SPAN_FILE_ENV)
    if configured:
        return Path(configured)
    running = running_context(context_paths(cwd=root))
    if running is not None and running.span_file:
        return Path(running.span_file)
    base = (root or Path.cwd()) / ".gfair"
    candidates = [path for path in base.glob("**/traces/spans.jsonl") if path.is_file()]
    return max(candidates, key=lambda path: path.stat().st_mtime, default=None)


def _job(args: argparse.Namespace) -> tuple[str | None, str]:
    owner, slash, job_id = args.job.partition("/")
    if not slash:
        return args.user, args.job
    if args.user is not None and args.user != owner:
        raise ValueError(f"job {args.job!r} belongs to {owner!r}, not --user {args.user!r}")
    return owner, job_id


def load_job_trace(args: argparse.Namespace) -> JobTrace:
    user, job_id = _job(args)
    jaeger = args.jaeger or (None if args.span_file else os.environ.get(JAEGER_URL_ENV))
    if jaeger:
        return JaegerQuery(jaeger).find_job_trace(job_id, user)
    path = args.span_file or default_span_file()
    if path is None:
        raise SpanFileError(
            f"no span file: pass --span-file or --jaeger, set ${SPAN_FILE_ENV}, or run "
            "where `gfair up` keeps .gfair/"
        )
    return find_job_trace(read_span_file(path), job_id, user)


def _trace(args: argparse.Namespace) -> int:
    try:
        found = load_job_trace(args)
    except (TraceNotFound, AmbiguousJob, SpanFileError, JaegerError, ValueError) as exc:
        return session.fail(str(exc))
    if args.json:
        output.print_json(found.to_json())
        return session.EXIT_OK
    console = output.console()
    console.print(render_tree(found))
    others = found.other_trace_ids
    if others:
        listed = ", ".join(others[:5]) + (" ..." if len(others) > 5 else "")
        console.print(f"[dim]{len(others)} other trace(s) also mention this job: {listed}[/]")
    return session.EXIT_OK


def _millis(ns: int) -> str:
    ms = ns / 1e6
    if ms >= 10_000:
        return f"{ms / 1000:.1f}s"
    return f"{ms:.1f}ms" if ms < 100 else f"{ms:.0f}ms"


def _attribute(value: object) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def span_line(span: SpanRecord, trace_start_ns: int, style: str) -> str:
    """One tree line: service, name, duration, offset from the trace's start, key attributes."""
    shown = " ".join(
        f"{key.removeprefix('gfair.')}={_attribute(span.attributes[key])}"
        for key in _SHOWN
        if key in span.attributes
    )
    error = " [bold red]ERROR[/]" if span.status == "ERROR" else ""
    return (
        f"[{style}]{escape(span.service)}[/] [bold]{escape(span.name)}[/]{error} "
        f"[dim]{_millis(span.duration_ns)} @+{_millis(span.start_ns - trace_start_ns)}[/]"
        + (f"  {escape(shown)}" if shown else "")
    )


def render_tree(found: JobTrace) -> Tree:
    start = found.start_ns
    services = sorted(found.services)
    styles = {s: _SERVICE_STYLES[i % len(_SERVICE_STYLES)] for i, s in enumerate(services)}
    title = (
        f"[bold]{escape(found.user)}/{escape(found.job_id)}[/]  trace {found.trace_id}  "
        f"{len(found.spans)} spans, {len(services)} services, "
        f"{_millis(found.end_ns - start)}"
    )
    tree = Tree(title)
    stack: list[tuple[SpanRecord, Tree]] = [
        (root, tree) for root in reversed(sorted(found.roots(), key=lambda s: s.start_ns))
    ]
    children: dict[str, list[SpanRecord]] = {}
    for span in found.spans:
        if span.parent_span_id is not None:
            children.setdefault(span.parent_span_id, []).append(span)
    while stack:
        span, parent = stack.pop()
        node = parent.add(span_line(span, start, styles[span.service]))
        kids = sorted(children.get(span.span_id, []), key=lambda s: s.start_ns)
        stack.extend((kid, node) for kid in reversed(kids))
    return tree
