"""The failure detector behind its heartbeats (issue 26): false suspicions and failures, and
the time to catch up, with the detector judging regardless (before) and not while a heartbeat of
every node waits unread (after), on a real broker.

Run: ``.venv/bin/python -m bench.heartbeat_backlog [--nodes 1000] [--rounds 50]``

Starts its own nats-server and, per variant, a failure detector with its real clock and timer
(a check a second; suspicion after `--suspect-after` s, failure after `--fail-after` s: a third
of the defaults, to keep the run short). `--nodes` nodes register and heartbeat once; then the
detector reads its node events slowly (`--slow-ms` each, as a detector starved of CPU) while
`--rounds` rounds of heartbeats from every node but one are published as fast as the broker
takes them (50,000 queued heartbeats by default) and for `--fail-after` seconds more; then it
reads at full speed until it has read them all (the catch-up time), and the live nodes
heartbeat every second until the silent one is failed (the time after the catch-up). Every
node but the silent one is alive throughout: each suspicion or failure of one is false.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gfair.bus.logs import configure_logging
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.publisher import EventPublisher
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.server import EmbeddedNatsServer, NatsServerConfig
from gfair.bus.service import Emit
from gfair.bus.transport import Bus
from gfair.events import Envelope
from gfair.events.nodes import GpuInfo, NodeFailed, NodeHeartbeat, NodeRegistered, NodeSuspected
from gfair.events.states import NodeState
from gfair_services.failure_detector import FailureDetector, Settings
from gfair_services.failure_detector.service import NodeInput

SILENT = "node-0000"
PARALLEL = 200


class SlowDetector(FailureDetector):
    """Reads each node event `delay_s` late while slow; counts what it read."""

    def __init__(self, settings: Settings) -> None:
        self.delay_s = 0.0
        self.read = 0
        super().__init__(settings)

    async def on_node_event(self, envelope: Envelope, data: NodeInput) -> Sequence[Emit]:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        outputs = await super().on_node_event(envelope, data)
        self.read += 1
        return outputs


class JudgingRegardless(SlowDetector):
    """The detector as it was: liveness judged whatever waits unread."""

    async def _heartbeats_unread(self) -> int | None:
        return None


@dataclass
class Outcome:
    false_suspicions: int
    false_failures: int
    most_unread: int
    catch_up_s: float
    silent_failed_after_s: float | None


def node_ids(count: int) -> list[str]:
    return [f"node-{n:04d}" for n in range(count)]


def registration(node_id: str) -> NodeRegistered:
    gpu = GpuInfo(
        index=0, uuid=f"GPU-{node_id}", name="V100", generation="v100", memory_bytes=16 << 30
    )
    return NodeRegistered(
        node_id=node_id, hostname=node_id, gpus=(gpu,), heartbeat_interval_s=5.0, simulated=True
    )


async def publish_all(
    tool: EventPublisher, events: Sequence[NodeRegistered | NodeHeartbeat]
) -> None:
    for start in range(0, len(events), PARALLEL):
        await asyncio.gather(*(tool.publish(e) for e in events[start : start + PARALLEL]))


async def unread(bus: Bus, detector: FailureDetector) -> int:
    route = next(r for r in detector.service.routes if r.consumer.durable.endswith("nodes"))
    return await bus.unread(route.consumer)


async def read_through(bus: Bus, detector: SlowDetector, count: int) -> int:
    """Until the detector has read `count` node events; the most that waited unread."""
    most = 0
    while detector.read < count:
        most = max(most, await unread(bus, detector))
        await asyncio.sleep(0.2)
    return most


async def judged(bus: Bus) -> list[tuple[str, str]]:
    found = []
    async for message in bus.history("GFAIR_NODES"):
        envelope = Envelope.model_validate_json(message.data)
        if envelope.source != "failure-detector":
            continue
        if envelope.type in (NodeSuspected.EVENT_TYPE, NodeFailed.EVENT_TYPE):
            found.append((envelope.type, str(envelope.data["node_id"])))
    return found


async def variant(bus: Bus, detector: SlowDetector, args: argparse.Namespace) -> Outcome:
    nodes = node_ids(args.nodes)
    live = [n for n in nodes if n != SILENT]
    tool = EventPublisher(bus, "bench-nodes")
    async with ServiceRuntime(detector.service, bus):
        await publish_all(tool, [registration(n) for n in nodes])
        await publish_all(tool, [NodeHeartbeat(node_id=n, seq=1) for n in nodes])
        await read_through(bus, detector, 2 * len(nodes))
        detector.delay_s = args.slow_ms / 1000
        slow_since = time.monotonic()
        most = 0
        for seq in range(2, 2 + args.rounds):
            await publish_all(tool, [NodeHeartbeat(node_id=n, seq=seq) for n in live])
        while time.monotonic() - slow_since < args.fail_after:
            most = max(most, await unread(bus, detector))
            await asyncio.sleep(1.0)
        expected = 2 * len(nodes) + args.rounds * len(live)
        detector.delay_s = 0.0
        released = time.monotonic()
        most = max(most, await read_through(bus, detector, expected))
        caught_up = time.monotonic()
        failed_at: float | None = None
        seq = 2 + args.rounds
        next_round = caught_up
        while failed_at is None and time.monotonic() - caught_up < 3 * args.fail_after:
            if time.monotonic() >= next_round:
                await publish_all(tool, [NodeHeartbeat(node_id=n, seq=seq) for n in live])
                seq, next_round = seq + 1, next_round + 1.0
            silent = detector.nodes.get(SILENT)
            if silent is not None and silent.state is NodeState.FAILED:
                failed_at = time.monotonic()
            await asyncio.sleep(0.05)
    found = [(kind, node) for kind, node in await judged(bus) if node != SILENT]
    return Outcome(
        false_suspicions=sum(kind == NodeSuspected.EVENT_TYPE for kind, _ in found),
        false_failures=sum(kind == NodeFailed.EVENT_TYPE for kind, _ in found),
        most_unread=most,
        catch_up_s=caught_up - released,
        silent_failed_after_s=None if failed_at is None else failed_at - caught_up,
    )


async def run(args: argparse.Namespace) -> None:
    settings = Settings(
        suspect_after_s=args.suspect_after,
        fail_after_s=args.fail_after,
        check_interval_s=1.0,
        heartbeat_record_s=60.0,
    )
    print(
        f"{args.nodes} nodes, {args.rounds * (args.nodes - 1):,} heartbeats queued behind a "
        f"detector reading one per {args.slow_ms:g} ms; suspect after {args.suspect_after:g} s, "
        f"fail after {args.fail_after:g} s"
    )
    print(
        f"{'variant':<34} {'false susp.':>11} {'false fail.':>11} {'most unread':>11} "
        f"{'catch-up s':>10} {'silent node failed, s after':>28}"
    )
    for name, make in (
        ("before: judging regardless", JudgingRegardless),
        ("after: not while behind", SlowDetector),
    ):
        with tempfile.TemporaryDirectory(prefix="gfair-heartbeat-backlog-") as tmp:
            server = EmbeddedNatsServer(NatsServerConfig(store_dir=Path(tmp) / "nats"))
            server.start()
            try:
                bus = await NatsBus.connect(NatsOptions(servers=(server.url,)))
                try:
                    found = await variant(bus, make(settings), args)
                finally:
                    await bus.close()
            finally:
                server.stop()
        failed = (
            "never" if found.silent_failed_after_s is None else f"{found.silent_failed_after_s:.1f}"
        )
        print(
            f"{name:<34} {found.false_suspicions:>11} {found.false_failures:>11} "
            f"{found.most_unread:>11,} {found.catch_up_s:>10.1f} {failed:>28}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=50, help="heartbeats queued per node")
    parser.add_argument("--slow-ms", type=float, default=20.0, help="delay per event while slow")
    parser.add_argument("--suspect-after", type=float, default=5.0)
    parser.add_argument("--fail-after", type=float, default=20.0)
    configure_logging("bench", level="WARNING", fmt="console")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
