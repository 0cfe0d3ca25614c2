"""Reading traces back: spans from the embedded mode's span file or from Jaeger, and the one
trace of a job's life in causal order (what `gfair trace` shows)."""

from gfair.traces.job_trace import (
    AmbiguousJob,
    JobTrace,
    TraceNotFound,
    causal_order,
    find_job_trace,
)
from gfair.traces.span_record import SpanFileError, SpanRecord, read_span_file

__all__ = [
    "AmbiguousJob",
    "JobTrace",
    "SpanFileError",
    "SpanRecord",
    "TraceNotFound",
    "causal_order",
    "find_job_trace",
    "read_span_file",
]
