"""In-memory key-value bucket with the revision semantics of a JetStream bucket.

As in JetStream, revisions are one counter per bucket (the backing stream's sequence), a
delete is a marker with its own revision, and `update` against a deleted key's marker
revision succeeds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from gfair.bus.key_value import KvConflict, KvEntry, KvOperation, KvWatch, validate_key
from gfair.bus.subject_filter import matches, validate_pattern
from gfair.bus.topology import BucketSpec


class _MemoryWatch(KvWatch):
    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._queue: asyncio.Queue[KvEntry | None] = asyncio.Queue()
        self._stopped = False
        self._on_stop: list[_MemoryWatch] | None = None

    def offer(self, entry: KvEntry) -> None:
        if not self._stopped and matches(self.pattern, entry.key):
            self._queue.put_nowait(entry)

    async def _entries(self) -> AsyncIterator[KvEntry]:
        while True:
            entry = await self._queue.get()
            if entry is None:
                return
            yield entry

    async def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            if self._on_stop is not None and self in self._on_stop:
                self._on_stop.remove(self)
            self._queue.put_nowait(None)


class InMemoryKeyValue:
    def __init__(self, spec: BucketSpec) -> None:
        self._spec = spec
        self._revision = 0
        self._latest: dict[str, KvEntry] = {}
        self._watches: list[_MemoryWatch] = []
        # One writer at a time, so a revision check and its write are atomic even when a
        # future change makes `_write` await.
        self._lock = asyncio.Lock()

    @property
    def bucket(self) -> str:
        return self._spec.name

    def _current_revision(self, key: str) -> int:
        entry = self._latest.get(key)
        return entry.revision if entry is not None else 0

    def _write(self, key: str, value: bytes, operation: KvOperation) -> int:
        self._revision += 1
        entry = KvEntry(key=key, value=value, revision=self._revision, operation=operation)
        self._latest[key] = entry
        for watch in list(self._watches):
            watch.offer(entry)
        return entry.revision

    async def get(self, key: str) -> KvEntry | None:
        validate_key(key)
        entry = self._latest.get(key)
        if entry is None or entry.operation is KvOperation.DELETE:
            return None
        return entry

    async def put(self, key: str, value: bytes) -> int:
        validate_key(key)
        async with self._lock:
            return self._write(key, bytes(value), KvOperation.PUT)

    async def create(self, key: str, value: bytes) -> int:
        validate_key(key)
        async with self._lock:
            entry = self._latest.get(key)
            if entry is not None and entry.operation is KvOperation.PUT:
                raise KvConflict(f"{self.bucket}/{key} exists at revision {entry.revision}")
            return self._write(key, bytes(value), KvOperation.PUT)

    async def update(self, key: str, value: bytes, revision: int) -> int:
        validate_key(key)
        async with self._lock:
            current = self._current_revision(key)
            if current != revision:
                raise KvConflict(f"{self.bucket}/{key} is at revision {current}, not {revision}")
            return self._write(key, bytes(value), KvOperation.PUT)

    async def delete(self, key: str, *, revision: int | None = None) -> None:
        validate_key(key)
        async with self._lock:
            current = self._current_revision(key)
            if revision is not None and current != revision:
                raise KvConflict(f"{self.bucket}/{key} is at revision {current}, not {revision}")
            self._write(key, b"", KvOperation.DELETE)

    async def keys(self) -> list[str]:
        return [entry.key for entry in await self.entries()]

    async def entries(self) -> list[KvEntry]:
        return [
            entry for _, entry in sorted(self._latest.items()) if entry.operation is KvOperation.PUT
        ]

    async def watch(self, pattern: str = ">", *, updates_only: bool = False) -> KvWatch:
        validate_pattern(pattern)
        watch = _MemoryWatch(pattern)
        if not updates_only:
            current = sorted(self._latest.values(), key=lambda e: e.revision)
            for entry in current:
                if entry.operation is KvOperation.PUT:
                    watch.offer(entry)
        watch._on_stop = self._watches
        self._watches.append(watch)
        return watch
