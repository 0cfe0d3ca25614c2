"""The key-value buckets of a gfair cluster and the one service that writes each."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class Bucket:
    name: str
    writer: str
    holds: str


JOBS = Bucket("gfair_jobs", "placement", "one JobRecord per job, key '<user>.<job_id>'")
NODES = Bucket("gfair_nodes", "failure-detector", "one NodeRecord per node, key '<node_id>'")
STRIDE = Bucket(
    "gfair_stride", "split-stride", "split-stride passes, GPU assignments and per-user usage"
)
PROFILES = Bucket("gfair_profiles", "profiler", "measured rates per user/job type per generation")
SHARES = Bucket("gfair_shares", "trading-auction", "per-user per-pool entitlements and trades")
FAILURES = Bucket(
    "gfair_failures",
    "failure-detector",
    "one JobFailureRecord per job (attempts, retries per class, decisions), key '<user>.<job_id>'",
)

ALL: tuple[Bucket, ...] = (JOBS, NODES, STRIDE, PROFILES, SHARES, FAILURES)


def job_key(user: str, job_id: str) -> str:
    return f"{user}.{job_id}"


class UnreadableRecord(ValueError):
    """A stored value that is not the record its key holds: whoever reads it skips it (or, for a
    service's whole state, starts afresh) and says so; nothing crash-loops on it."""

    def __init__(self, bucket: str, key: str, revision: int, value: bytes, error: str) -> None:
        super().__init__(f"{bucket}/{key} (revision {revision}) is not a valid record: {error}")
        self.bucket, self.key, self.revision, self.value = bucket, key, revision, value


def read_record(
    model: type[M], bucket: str, key: str, value: bytes | Mapping[str, object], revision: int = 0
) -> M:
    """`value` (stored, or already parsed from a larger value) as a `model`, else
    `UnreadableRecord` naming where it lies."""
    try:
        if isinstance(value, bytes):
            return model.model_validate_json(value)
        return model.model_validate(value)
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(str(part) for part in problem["loc"]) or "the value"
        raw = value if isinstance(value, bytes) else json.dumps(value, default=str).encode()
        raise UnreadableRecord(bucket, key, revision, raw, f"{where}: {problem['msg']}") from None
