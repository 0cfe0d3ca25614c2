"""The key-value buckets of a gfair cluster and the one service that writes each."""

from __future__ import annotations

from dataclasses import dataclass


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
