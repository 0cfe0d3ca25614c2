"""`KeyValue` over a JetStream key-value bucket (nats-py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

import nats.js.errors
from nats.js.kv import KeyValue as NatsKeyValueBucket

from gfair.bus.key_value import KvConflict, KvEntry, KvOperation, KvWatch, validate_key
from gfair.bus.subject_filter import validate_pattern
from gfair.bus.transport import StoredMessage

_KV_OPERATION = "KV-Operation"
_DELETED = frozenset({"DEL", "PURGE"})
# JetStream's "wrong last sequence" errors: a revision check failed.
_WRONG_LAST_SEQUENCE = frozenset({10071, 10164})


def _entry(key: str, value: bytes | None, revision: int | None, operation: str | None) -> KvEntry:
    deleted = operation in _DELETED
    return KvEntry(
        key=key,
        value=b"" if deleted or value is None else value,
        revision=revision or 0,
        operation=KvOperation.DELETE if deleted else KvOperation.PUT,
    )


class _NatsWatch(KvWatch):
    def __init__(
        self, watcher: NatsKeyValueBucket.KeyWatcher, skip_through: int, initial_through: int
    ) -> None:
        self._watcher = watcher
        # Entries at or below this revision existed before the watch (updates_only); 0 keeps all.
        self._skip_through = skip_through
        # The bucket's last revision as the watch began: a tombstone at or below it is no change.
        self._initial_through = initial_through
        self._stopped = False

    async def _entries(self) -> AsyncIterator[KvEntry]:
        caught_up = False
        async for item in self._watcher:
            if item is None:
                # nats-py marks the end of the initial values with None.
                caught_up = True
                continue
            entry = _entry(item.key, item.value, item.revision, item.operation)
            if entry.revision <= self._skip_through:
                continue
            if entry.operation is KvOperation.DELETE and (
                not caught_up or entry.revision <= self._initial_through
            ):
                # The initial snapshot lists current values; a tombstone is not one. (nats-py
                # marks the snapshot's end before its entries when the consumer had sent them all
                # and none was read yet as it asked: hence the revision too.)
                continue
            yield entry

    async def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            await self._watcher.stop()  # type: ignore[no-untyped-call]


class StreamReader(Protocol):
    def read(
        self,
        stream: str,
        *,
        filter_subjects: tuple[str, ...] = (),
        start_sequence: int = 1,
        last_per_subject: bool = False,
    ) -> AsyncIterator[StoredMessage]: ...


class NatsKeyValue:
    def __init__(self, bucket: NatsKeyValueBucket, name: str, reader: StreamReader) -> None:
        self._kv = bucket
        self._name = name
        self._reader = reader

    @property
    def bucket(self) -> str:
        return self._name

    async def get(self, key: str) -> KvEntry | None:
        validate_key(key)
        try:
            found = await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        return _entry(key, found.value, found.revision, None)

    async def put(self, key: str, value: bytes) -> int:
        validate_key(key)
        return await self._kv.put(key, value)

    async def create(self, key: str, value: bytes) -> int:
        validate_key(key)
        try:
            return await self._kv.create(key, value)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise KvConflict(f"{self._name}/{key} exists: {exc.description}") from exc

    async def update(self, key: str, value: bytes, revision: int) -> int:
        validate_key(key)
        try:
            return await self._kv.update(key, value, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError as exc:
            raise KvConflict(f"{self._name}/{key} not at revision {revision}") from exc

    async def delete(self, key: str, *, revision: int | None = None) -> None:
        validate_key(key)
        try:
            await self._kv.delete(key, last=revision)
        except nats.js.errors.APIError as exc:
            if exc.err_code in _WRONG_LAST_SEQUENCE:
                raise KvConflict(f"{self._name}/{key} not at revision {revision}") from exc
            raise

    async def keys(self) -> list[str]:
        return [entry.key for entry in await self.entries()]

    async def entries(self) -> list[KvEntry]:
        # nats-py's keys() decides it has seen everything from a consumer-info snapshot that can
        # race the subscription and come back empty; reading the last message of each key up to
        # the bucket's end at call time cannot.
        subjects = f"$KV.{self._name}."
        found: dict[str, KvEntry] = {}
        async for message in self._reader.read(
            f"KV_{self._name}", filter_subjects=(f"{subjects}>",), last_per_subject=True
        ):
            key = message.subject[len(subjects) :]
            operation = message.headers.get(_KV_OPERATION)
            found[key] = _entry(key, message.data, message.sequence, operation)
        return [found[key] for key in sorted(found) if found[key].operation is KvOperation.PUT]

    async def watch(self, pattern: str = ">", *, updates_only: bool = False) -> KvWatch:
        validate_pattern(pattern)
        status = await self._kv.status()
        last = status.stream_info.state.last_seq
        watcher = await self._kv.watch(pattern)
        # Let the watcher's subscription start before the caller writes.
        await asyncio.sleep(0)
        return _NatsWatch(watcher, last if updates_only else 0, last)
