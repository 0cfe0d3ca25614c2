"""Key-value buckets for service state, with revision-checked writes (compare-and-set).

The one-writer-per-record rule (docs/design.md §3.3) is enforced by `create` and `update`: a writer
that lost a race gets `KvConflict` and re-reads instead of overwriting.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

_KEY = re.compile(r"^[-/_=.a-zA-Z0-9]+$")


class KvOperation(StrEnum):
    PUT = "put"
    DELETE = "delete"


class KvConflict(RuntimeError):
    """A create found the key present, or an update found a different latest revision."""


class InvalidKey(ValueError):
    pass


def validate_key(key: str) -> None:
    if not _KEY.match(key) or key.startswith(".") or key.endswith("."):
        raise InvalidKey(f"key {key!r} must match [-/_=.a-zA-Z0-9]+ and not start or end with '.'")


@dataclass(frozen=True, slots=True)
class KvEntry:
    key: str
    value: bytes
    revision: int
    operation: KvOperation = KvOperation.PUT


class KvWatch(ABC):
    """Entries as they change; iterate with `async for`, stop with `stop()` (or `async with`).

    A bucket's watch says how it reads entries (`_entries`) and stops; the rest is this."""

    @abstractmethod
    def _entries(self) -> AsyncIterator[KvEntry]: ...

    @abstractmethod
    async def stop(self) -> None: ...

    def __aiter__(self) -> AsyncIterator[KvEntry]:
        return self._entries()

    async def __aenter__(self) -> KvWatch:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


class KeyValue(Protocol):
    @property
    def bucket(self) -> str: ...

    async def get(self, key: str) -> KvEntry | None:
        """The latest value, or None if the key never existed or was deleted."""
        ...

    async def put(self, key: str, value: bytes) -> int:
        """Write unconditionally; returns the new revision."""
        ...

    async def create(self, key: str, value: bytes) -> int:
        """Write only if the key holds no value; else `KvConflict`."""
        ...

    async def update(self, key: str, value: bytes, revision: int) -> int:
        """Write only if the key's latest revision is `revision`; else `KvConflict`."""
        ...

    async def delete(self, key: str, *, revision: int | None = None) -> None:
        """Delete (optionally only at `revision`); deleting an absent key is not an error."""
        ...

    async def keys(self) -> list[str]:
        """Keys holding a value, sorted."""
        ...

    async def entries(self) -> list[KvEntry]:
        """The latest entry of every key holding a value, by key: one read of the bucket,
        where a `get` per key is a round trip each."""
        ...

    async def watch(self, pattern: str = ">", *, updates_only: bool = False) -> KvWatch:
        """Current values of matching keys first (unless `updates_only`), then each change.

        Deletions arrive as entries with `operation=DELETE` and an empty value.
        """
        ...
