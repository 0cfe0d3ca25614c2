"""Bucket writes that go out at once and are waited for together, when a batch settles.

A service that keeps a record per event (a job's profile, its failure book) would otherwise
wait a round trip for each write before it handles the next event. `WriteBehind` sends each
write when it is made and leaves the waiting to the route's `settle` hook, which the runtime
awaits before it acknowledges the batch's inputs: a write is acknowledged before the input that
caused it is, as when it was awaited in the handler.

Writes of one key leave, and are applied, in the order they were made (one connection, one
stream). A write that fails is sent again at the next settling, unless a later write of the key
superseded it, so the bucket comes to hold what the service holds in memory even when the
batch that made the write is handled again and, finding its change already made, writes
nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gfair.bus.key_value import KeyValue


@dataclass(frozen=True, slots=True)
class _Write:
    kv: KeyValue
    key: str
    value: bytes | None  # None: delete

    async def run(self) -> None:
        if self.value is None:
            await self.kv.delete(self.key)
        else:
            await self.kv.put(self.key, self.value)


class WriteBehind:
    def __init__(self) -> None:
        self._sent: list[tuple[_Write, asyncio.Task[None]]] = []
        # Failed writes still to make, by (bucket, key): only the latest of a key matters.
        self._failed: dict[tuple[str, str], _Write] = {}

    def put(self, kv: KeyValue, key: str, value: bytes) -> None:
        self._send(_Write(kv, key, value))

    def delete(self, kv: KeyValue, key: str) -> None:
        self._send(_Write(kv, key, None))

    def writing(self, kv: KeyValue, key: str) -> bool:
        """Whether a write of `key` is not yet acknowledged: a read now might not see it."""
        slot = (kv.bucket, key)
        return slot in self._failed or any(
            (write.kv.bucket, write.key) == slot for write, _ in self._sent
        )

    def _send(self, write: _Write) -> None:
        self._failed.pop((write.kv.bucket, write.key), None)
        task = asyncio.get_running_loop().create_task(write.run())
        self._sent.append((write, task))

    async def settle(self) -> None:
        """Until every write made so far is acknowledged; raises the first failure.

        Failed writes are kept and sent again by the next call.
        """
        for write in list(self._failed.values()):
            self._send(write)
        sent, self._sent = self._sent, []
        results = await asyncio.gather(*(task for _, task in sent), return_exceptions=True)
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        # Only the latest write of a key counts: it holds the value the service has now.
        latest: dict[tuple[str, str], tuple[_Write, bool]] = {}
        for (write, _), outcome in zip(sent, results, strict=True):
            latest[(write.kv.bucket, write.key)] = (write, isinstance(outcome, BaseException))
        for slot, (write, failed) in latest.items():
            # One made since (by a handler running meanwhile) supersedes it.
            if failed and not any((w.kv.bucket, w.key) == slot for w, _ in self._sent):
                self._failed[slot] = write
        if failure is not None:
            raise failure
