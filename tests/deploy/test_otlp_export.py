"""Spans and metrics reach an OTLP/HTTP collector (`OTEL_EXPORTER_OTLP_ENDPOINT`), as in the
compose deployment, where the services export to the OpenTelemetry collector."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.metrics import GfairMetrics
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.observability import ObservabilitySettings, configure_observability
from gfair.bus.publisher import EventPublisher
from gfair.bus.runner import RunnerSettings
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.service import Emit, Service
from gfair.bus.topology import Topology, contract_streams
from gfair.events.commands import StartCommand
from gfair.events.envelope import Envelope
from gfair.events.jobs import JobAccepted, JobLaunch, JobPlaced
from gfair.traces import SpanRecord
from support.waiting import eventually

from .otlp_sink import OtlpSink

FAST = RunnerSettings(batch=10, fetch_timeout_s=0.05, error_pause_s=0.05)


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


def one(spans: list[SpanRecord], name: str) -> SpanRecord:
    (found,) = [s for s in spans if s.name == name]
    return found


async def test_a_service_runtime_exports_its_spans_and_metrics_over_otlp_http(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with OtlpSink() as sink:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.url)
        settings = ObservabilitySettings(metrics_interval_s=3600)
        observability = configure_observability("split-stride", settings, set_global=False)
        assert observability.meter_provider is not None
        service = Service("split-stride")
        handled = asyncio.Event()

        @service.handler()
        async def on_placed(envelope: Envelope, data: JobPlaced) -> list[Emit]:
            handled.set()
            command = StartCommand(
                node_id=data.servers[0],
                user=data.user,
                job_id=data.job_id,
                attempt=1,
                command=("python", "train.py"),
                gpu_indices=(0, 1),
                checkpoint_dir="/ckpt/alice/j1",
            )
            return [Emit(command)]

        bus = InMemoryBus()
        runtime = ServiceRuntime(
            service,
            bus,
            tracer=observability.tracer,
            settings=FAST,
            extra_topology=Topology(streams=contract_streams()),
        )
        async with runtime:
            placed = JobPlaced(user="alice", job_id="j1", servers=("v100-0",), generation="v100")
            await EventPublisher(bus, "placement", tracer=observability.tracer).publish(placed)
            await asyncio.wait_for(handled.wait(), 10)
        instruments = GfairMetrics(observability.meter_provider.get_meter("gfair"))
        instruments.record_quantum(0.002, waiting=1)
        observability.shutdown()  # flushes both exporters to the collector
        spans = sink.spans()
        metrics = sink.metric_names()
    produce = one(spans, "publish gfair.job.placed.v1")
    process = one(spans, "process gfair.job.placed.v1")
    command = one(spans, "publish gfair.cmd.start.v1")
    assert {s.service for s in spans} == {"split-stride"}
    assert produce.trace_id == process.trace_id == command.trace_id
    assert process.parent_span_id == produce.span_id and process.kind == "CONSUMER"
    assert command.parent_span_id == process.span_id and command.kind == "PRODUCER"
    assert process.attributes["gfair.job.id"] == "j1"
    assert process.attributes["gfair.servers"] == ["v100-0"]
    assert command.attributes["gfair.node"] == "v100-0"
    assert command.attributes["gfair.gpus"] == 2
    assert command.attributes["messaging.destination.name"] == "gfair.cmd.v100-0.start"
    assert metrics == {"split-stride": {"gfair.quantum.decision.duration", "gfair.jobs.waiting"}}


@pytest.mark.nats
async def test_a_service_process_exports_to_the_collector_it_is_configured_with(
    nats_url: str, tmp_path: Path
) -> None:
    with OtlpSink() as sink:
        env = {
            **os.environ,
            "GFAIR_NATS_URL": nats_url,
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url,
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # export spans within 0.1 s, not 5 s
            "GFAIR_LOG_LEVEL": "WARNING",
        }
        env.pop("GFAIR_SPAN_FILE", None)
        gfair = Path(sys.executable).parent / "gfair"
        log = tmp_path / "profiler.log"
        with log.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                str(gfair),
                "service",
                "profiler",
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=stderr,
            )
        try:
            bus = await NatsBus.connect(NatsOptions(servers=(nats_url,)))
            try:
                await bus.ensure_topology(Topology(streams=contract_streams()))
                publisher = EventPublisher(bus, "test")
                await publisher.publish(
                    JobAccepted(
                        user="alice", job_id="j7", gpus=2, launch=JobLaunch(command=("true",))
                    )
                )

                def handled() -> bool:
                    names = {s.name for s in sink.spans() if s.service == "profiler"}
                    return "process gfair.job.accepted.v1" in names

                await eventually(handled, 30)
            finally:
                await bus.close()
        finally:
            process.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(process.wait(), 30)
        spans = sink.spans()
    assert code == 0, log.read_text()
    accepted = one([s for s in spans if s.service == "profiler"], "process gfair.job.accepted.v1")
    assert accepted.attributes["gfair.job.id"] == "j7"
    assert accepted.attributes["gfair.user"] == "alice"
    assert accepted.attributes["gfair.outcome"] == "handled"
