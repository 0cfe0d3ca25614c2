"""Machine-readable reasons that travel with job events, beside the human-readable text."""

from __future__ import annotations

from enum import StrEnum


class FailureClass(StrEnum):
    """How a job run ended (docs/design.md §2.6); the failure policy retries by class."""

    SUCCESS = "success"
    # Non-zero exit of the program itself: deterministic, retried at most once.
    USER_ERROR = "user_error"
    OUT_OF_MEMORY = "out_of_memory"
    # Node lost, GPU error (NVML XID), executor crash: resumes from checkpoint elsewhere.
    INFRASTRUCTURE = "infrastructure"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"
    # Its running time passed its time limit (`JobLaunch.time_limit`): stopped by split-stride.
    TIME_LIMIT = "time_limit"


class RejectionCode(StrEnum):
    """Which admission check turned a submission away."""

    INVALID = "invalid"
    # The user in the payload is not the user of the subject it came on.
    USER_MISMATCH = "user_mismatch"
    UNKNOWN_USER = "unknown_user"
    DUPLICATE_JOB_ID = "duplicate_job_id"
    # Within the contract, but beyond an operator's limit on one submission (GPUs, command or
    # environment size, tickets).
    LIMIT_EXCEEDED = "limit_exceeded"
    # More GPUs than any pool of the cluster has: it could never run.
    UNSATISFIABLE = "unsatisfiable"
    # Its user already has as many unfinished jobs as the operator allows (placement's
    # max_pending_jobs); it may submit again once some end.
    TOO_MANY_PENDING = "too_many_pending"
    # `after_ok` names a job id the user has no job under.
    UNKNOWN_DEPENDENCY = "unknown_dependency"
    # `after_ok` names a job that already failed, was cancelled or rejected: it could never run.
    DEPENDENCY_FAILED = "dependency_failed"


class SuspendReason(StrEnum):
    # Its quantum ended and another job won the GPUs.
    TIME_SLICE = "time_slice"
    MIGRATION = "migration"
    # The node is being drained by an operator or the failure detector.
    DRAIN = "drain"
    # A prepared start (`PrepareCommand`): the process started without GPUs and waits, parked,
    # for its first slice.
    PREPARED = "prepared"


class MigrationReason(StrEnum):
    # Ticket load per GPU drifted apart between servers of a generation.
    LOAD_BALANCE = "load_balance"
    # A pool where the user holds more entitlement (or more speedup) has room.
    HETEROGENEITY = "heterogeneity"
    NODE_FAILURE = "node_failure"
    DRAIN = "drain"
