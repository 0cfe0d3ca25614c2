"""Placement's view of the live jobs: their records, with the bucket revisions they were read or
written at (placement is the only writer of `gfair_jobs`); and of the ended ones, when each
ended, so that their records can be purged once the retention has passed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from gfair.state.job_record import JobRecord, StoredJob
from gfair_services.retention import EndedJobs


class LiveJobs:
    def __init__(self) -> None:
        self._jobs: dict[str, StoredJob] = {}
        self._per_user: Counter[str] = Counter()
        self.ended = EndedJobs()

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
        """Remember `record` at `revision`; of a terminal record, only when it ended."""
        if not record.live:
            self.remove(record.key)
            if record.ended_at is not None:
                self.ended.note(record.key, record.ended_at)
            return
        if record.key not in self._jobs:
            self._per_user[record.user] += 1
        self._jobs[record.key] = StoredJob(record=record, revision=revision)

    def remove(self, key: str) -> None:
        gone = self._jobs.pop(key, None)
        if gone is not None:
            self._per_user[gone.record.user] -= 1
