"""A service as its own process: `main(service)` against a real server, stopped by SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider

from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.publisher import EventPublisher
from gfair.bus.server import EmbeddedNatsServer
from gfair.bus.topology import ConsumerSpec, Topology, contract_streams
from gfair.events import NodeHeartbeat
from support.waiting import eventually

pytestmark = pytest.mark.nats

SERVICE = textwrap.dedent(
    """
    import asyncio

    import structlog

    from gfair.bus import BucketSpec, Emit, Service, ServiceRuntime, Topology, contract_streams
    from gfair.bus import main
    from gfair.events import Envelope, NodeHeartbeat

    service = Service(
        "e2e", topology=Topology(streams=contract_streams(), buckets=(BucketSpec(name="e2e"),))
    )
    state = {}

    @service.on_start
    async def open_bucket(runtime: ServiceRuntime) -> None:
        state["kv"] = await runtime.key_value("e2e")

    @service.handler(durable="e2e-heartbeats")
    async def on_heartbeat(envelope: Envelope, data: NodeHeartbeat) -> list[Emit]:
        structlog.get_logger("e2e").info("heartbeat seen", node=data.node_id)
        await state["kv"].put("started", b"1")
        await asyncio.sleep(1.0)  # SIGTERM arrives now: this must still finish and ack
        await state["kv"].put("finished", b"1")
        return []

    main(service)
    """
)


async def test_sigterm_drains_a_service_process_and_its_spans_continue_the_trace(
    nats_server: EmbeddedNatsServer, tmp_path: Path, tracer_provider: TracerProvider
) -> None:
    script = tmp_path / "e2e_service.py"
    script.write_text(SERVICE)
    span_file = tmp_path / "spans.jsonl"
    env = os.environ | {
        "GFAIR_NATS_URL": nats_server.url,
        "GFAIR_SPAN_FILE": str(span_file),
        "GFAIR_LOG_LEVEL": "INFO",
    }
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    bus = await NatsBus.connect(NatsOptions(servers=(nats_server.url,)))
    await bus.ensure_topology(Topology(streams=contract_streams()))
    process = subprocess.Popen(  # noqa: ASYNC220 - started once, reaped in a thread
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        tracer = tracer_provider.get_tracer("test")
        with tracer.start_as_current_span("operator") as root:
            await EventPublisher(bus, "test", tracer=tracer).publish(
                NodeHeartbeat(node_id="n1", seq=1)
            )

        async def started() -> bool:
            try:
                kv = await bus.key_value("e2e")
            except Exception:
                return False
            return await kv.get("started") is not None

        await eventually(started, timeout_s=20)
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(process.communicate, timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr.decode()
    kv = await bus.key_value("e2e")
    assert await kv.get("finished") is not None  # the handler in flight was finished ...
    pull = await bus.consume(ConsumerSpec(stream="GFAIR_NODES", durable="e2e-heartbeats"))
    assert await pull.fetch(1, 1.0) == []  # ... and its message acknowledged before exit
    await bus.close()

    trace_id = f"{root.get_span_context().trace_id:032x}"
    spans = [json.loads(line) for line in span_file.read_text().splitlines()]
    (process_span,) = [s for s in spans if s["name"] == "process gfair.node.heartbeat.v1"]
    assert process_span["trace_id"] == trace_id and process_span["service.name"] == "e2e"
    assert process_span["parent_span_id"] is not None
    logs = [json.loads(line) for line in stderr.decode().splitlines() if line.startswith("{")]
    (seen,) = [entry for entry in logs if entry["event"] == "heartbeat seen"]
    assert seen["trace_id"] == trace_id and seen["span_id"] == process_span["span_id"]
    assert any(entry["event"] == "stop requested" for entry in logs)
