"""The five scheduler services in this process, on one bus, driven from synchronous tests.

Hypothesis runs each example synchronously, while the services must keep running between
examples (their state carries over, as in a live cluster). So the services live on an event
loop in a background thread, and a test hands it coroutines (`run`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from gfair.bus.dead_letter import DeadLetter
from gfair.bus.memory_bus import InMemoryBus
from gfair.bus.nats_bus import NatsBus
from gfair.bus.publisher import EventPublisher
from gfair.bus.runner import RunnerSettings
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.subject_filter import matches_any
from gfair.bus.topology import DEAD_LETTER_STREAM
from gfair.bus.transport import Bus, PubAck, StoredMessage
from gfair.embedded_cluster import SCHEDULER_SERVICES
from gfair.events.subjects import STREAMS
from gfair.state import buckets
from gfair_services.entrypoint import service_module, settings_class

T = TypeVar("T")
FAST = RunnerSettings(batch=50, fetch_timeout_s=0.02, error_pause_s=0.02)
# A pull from a real server is a round trip: one that short would time out on the client side.
NATS_FAST = RunnerSettings(batch=50, fetch_timeout_s=0.25, error_pause_s=0.05)

# Timers that would change state between examples on their own are pushed out of reach: no
# quantum ticks, no liveness verdicts, no entitlement recomputations while fuzzing.
QUIET: Mapping[str, object] = {
    "quantum_s": 3600.0,
    "suspect_after_s": 3600.0,
    "fail_after_s": 3600.0,
    "recompute_interval_s": 3600.0,
}

# A bucket's state as (key, revision) pairs: any write changes it.
Snapshot = dict[str, frozenset[tuple[str, int]]]


class LiveServices:
    """Start with `start()`, drive with `run(coro)`, end with `stop()`."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[Bus]],
        settings: Mapping[str, object] | None = None,
        runner: RunnerSettings = FAST,
    ) -> None:
        self._connect = connect
        self._runner = runner
        self._settings = {**QUIET, **(settings or {})}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runtimes: list[ServiceRuntime] = []
        self._names: list[str] = []
        self._watchers: list[asyncio.Task[None]] = []
        self._bus: Bus | None = None
        self.tool: EventPublisher | None = None

    @property
    def bus(self) -> Bus:
        assert self._bus is not None, "not started"
        return self._bus

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def start(self) -> None:
        self._thread.start()
        self.run(self._start(), timeout_s=60.0)

    def stop(self) -> None:
        try:
            self.run(self._stop(), timeout_s=60.0)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10.0)
            self._loop.close()

    async def _start(self) -> None:
        self._bus = await self._connect()
        self.tool = EventPublisher(self._bus, "fuzzer")
        for name in SCHEDULER_SERVICES:
            module = service_module(name)
            cls = settings_class(module)
            settings = cls(**{k: v for k, v in self._settings.items() if k in cls.model_fields})
            service = module.build_service(settings)
            runtime = ServiceRuntime(service, self._bus, settings=self._runner)
            await runtime.start()
            self._names.append(service.name)
            self._runtimes.append(runtime)
            self._watchers.append(asyncio.create_task(runtime.wait()))

    async def _stop(self) -> None:
        for runtime in self._runtimes:
            await runtime.stop()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        await self.bus.close()

    def crashed(self) -> list[str]:
        """Services whose runtime ended on its own: a runner died of an exception."""
        return [
            f"{name}: {watcher.exception() if not watcher.cancelled() else 'cancelled'}"
            for name, watcher in zip(self._names, self._watchers, strict=True)
            if watcher.done()
        ]

    # -- what a test does inside `run` ------------------------------------------------------

    async def publish_raw(self, subject: str, payload: bytes, msg_id: str | None) -> PubAck:
        return await self.bus.publish(subject, payload, msg_id=msg_id)

    async def settle(self, timeout_s: float = 20.0) -> None:
        """Until every consumer has handled everything stored (and what that caused)."""
        deadline = time.monotonic() + timeout_s
        quiet = 0
        while quiet < 3:  # a few idle looks in a row: outputs may still be in flight
            quiet = quiet + 1 if await self._idle() else 0
            if time.monotonic() > deadline:
                raise AssertionError(f"services did not settle within {timeout_s}s")
            await asyncio.sleep(0.005)

    async def _idle(self) -> bool:
        bus = self.bus
        if isinstance(bus, InMemoryBus):
            # Test inspection of the in-memory broker: nothing unread, nothing unacknowledged.
            for state in bus._consumers.values():
                unread = state.stream.messages[state.cursor - 1 :]
                if state.pending or any(
                    matches_any(state.spec.filter_subjects, m.subject) for m in unread
                ):
                    return False
            return True
        assert isinstance(bus, NatsBus)
        js = bus.client.jetstream()
        for stream in STREAMS:
            for info in await js.consumers_info(stream.name):
                if info.name.startswith("history-"):
                    continue
                if (info.num_pending or 0) or (info.num_ack_pending or 0):
                    return False
        return True

    async def snapshot(self) -> Snapshot:
        found: Snapshot = {}
        for bucket in buckets.ALL:
            kv = await self.bus.key_value(bucket.name)
            pairs = set()
            for key in await kv.keys():
                entry = await kv.get(key)
                if entry is not None:
                    pairs.add((key, entry.revision))
            found[bucket.name] = frozenset(pairs)
        return found

    async def messages(self, stream: str, start: int = 1) -> list[StoredMessage]:
        return [m async for m in self.bus.history(stream, start_sequence=start)]

    async def dead_letters(self, start: int = 1) -> list[DeadLetter]:
        return [
            DeadLetter.model_validate_json(m.data)
            for m in await self.messages(DEAD_LETTER_STREAM, start)
        ]

    async def last_sequence(self, stream: str) -> int:
        bus = self.bus
        if isinstance(bus, InMemoryBus):
            return len(bus.stream_messages(stream))
        assert isinstance(bus, NatsBus)
        info = await bus.client.jetstream().stream_info(stream)
        return int(info.state.last_seq)
