"""gfair.bus: the runtime every gfair service is built on.

A service is a table of handlers (`Service`); `ServiceRuntime` runs it on a `Bus` (NATS
JetStream in production, `InMemoryBus` in tests) with durable consumers, dedup by event id,
dead-lettering, key-value state, W3C tracing and structured logs.
"""

from gfair.bus.dead_letter import DeadLetter, DeadLetterReason
from gfair.bus.history import HistoricalEvent, read_history
from gfair.bus.key_value import KeyValue, KvConflict, KvEntry, KvOperation, KvWatch
from gfair.bus.logs import add_trace_context, configure_logging
from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.metrics import GfairMetrics, JsonlMetricExporter, configure_metrics, gfair_metrics
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.observability import Observability, ObservabilitySettings, configure_observability
from gfair.bus.publisher import EventPublisher, derived_event_id
from gfair.bus.runner import DeliveryOutcome, RunnerSettings
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.serve import BusSettings, main, serve
from gfair.bus.server import EmbeddedNatsServer, NatsServerConfig, NatsServerError
from gfair.bus.service import Backoff, Emit, Route, Service, Unprocessable
from gfair.bus.span_file import JsonlSpanExporter
from gfair.bus.topology import (
    DEAD_LETTER_STREAM,
    BucketSpec,
    ConsumerSpec,
    DeliverPolicy,
    Storage,
    StreamSpec,
    Topology,
    consumer_for,
    contract_streams,
    dead_letter_stream,
    dead_letter_subject,
)
from gfair.bus.tracing import current_traceparent, job_attributes, span_in_trace, trace_links
from gfair.bus.transport import (
    Bus,
    BusError,
    Delivery,
    NoStreamForSubject,
    PubAck,
    PullConsumer,
    StoredMessage,
    TopologyConflict,
)

__all__ = [
    "DEAD_LETTER_STREAM",
    "Backoff",
    "BucketSpec",
    "Bus",
    "BusError",
    "BusSettings",
    "ConsumerSpec",
    "DeadLetter",
    "DeadLetterReason",
    "DeliverPolicy",
    "Delivery",
    "DeliveryOutcome",
    "EmbeddedNatsServer",
    "Emit",
    "EventPublisher",
    "GfairMetrics",
    "HistoricalEvent",
    "InMemoryBus",
    "JsonlMetricExporter",
    "JsonlSpanExporter",
    "KeyValue",
    "KvConflict",
    "KvEntry",
    "KvOperation",
    "KvWatch",
    "NatsBus",
    "NatsOptions",
    "NatsServerConfig",
    "NatsServerError",
    "NoStreamForSubject",
    "Observability",
    "ObservabilitySettings",
    "PubAck",
    "PullConsumer",
    "Route",
    "RunnerSettings",
    "Service",
    "ServiceRuntime",
    "Storage",
    "StoredMessage",
    "StreamSpec",
    "Topology",
    "TopologyConflict",
    "Unprocessable",
    "add_trace_context",
    "configure_logging",
    "configure_metrics",
    "configure_observability",
    "consumer_for",
    "contract_streams",
    "current_traceparent",
    "dead_letter_stream",
    "dead_letter_subject",
    "derived_event_id",
    "gfair_metrics",
    "job_attributes",
    "main",
    "read_history",
    "serve",
    "span_in_trace",
    "trace_links",
]
