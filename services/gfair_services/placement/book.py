"""Placement's view of the live jobs: their records, with the bucket revisions they were read or
written at (placement is the only writer of `gfair_jobs`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from gfair.state.job_record import JobRecord, StoredJob


class JobBook:
    def __init__(self) -> None:
        self._jobs: dict[str, StoredJob] = {}
        self._per_user: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, key: object) -> bool:
        return key in self._jobs

    def __iter__(self) -> Iterator[StoredJob]:
        return iter(list(self._jobs.values()))

    def get(self, key: str) -> StoredJob | None:
        return self._jobs.get(key)

    def unfinished(self, user: str) -> int:
        """How many of `user`'s jobs are live (queued, running or suspended)."""
        return self._per_user[user]

    def put(self, record: JobRecord, revision: int) -> None:
        """Remember `record` at `revision`; a terminal record is forgotten."""
        if not record.live:
            self.remove(record.key)
            return
        if record.key not in self._jobs:
            self._per_user[record.user] += 1
        self._jobs[record.key] = StoredJob(record=record, revision=revision)

    def remove(self, key: str) -> None:
        gone = self._jobs.pop(key, None)
        if gone is not None:
            self._per_user[gone.record.user] -= 1
