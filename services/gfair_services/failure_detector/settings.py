"""Settings of the failure detector (environment `GFAIR_*`, or flags of `gfair service`)."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from gfair.core.failure import FailureClass
from gfair.core.health import HeartbeatPolicy, QuarantinePolicy
from gfair.core.retry import BackOff, RetryPolicy
from gfair_services.retention import RetentionSettings
from gfair_services.topology import TopologySettings


class FailureDetectorSettings(TopologySettings, RetentionSettings):
    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

    suspect_after_s: float = Field(
        default=15.0, gt=0, description="Silence after which a node is suspected"
    )
    fail_after_s: float = Field(
        default=60.0, gt=0, description="Silence after which a node is failed, its jobs re-placed"
    )
    check_interval_s: float = Field(
        default=1.0, gt=0, description="How often liveness and hung jobs are checked"
    )
    hang_after_s: float = Field(
        default=600.0,
        gt=0,
        description="A running job without progress for this long is killed and retried",
    )
    user_error_retries: int = Field(
        default=1, ge=0, description="Retries of a job after user/program errors"
    )
    oom_retries: int = Field(default=1, ge=0, description="Retries after out-of-memory")
    infrastructure_retries: int = Field(
        default=5, ge=0, description="Retries after node, GPU or executor failures"
    )
    retry_base_s: float = Field(default=10.0, ge=0, description="Delay before a first retry")
    retry_factor: float = Field(default=2.0, ge=1, description="Back-off growth per retry")
    retry_cap_s: float = Field(default=600.0, ge=0, description="Longest delay before a retry")
    retry_jitter: float = Field(
        default=0.1, ge=0, le=1, description="Spread of retry delays (fraction either way)"
    )
    quarantine_failures: int = Field(
        default=3, ge=1, description="Infrastructure failures within the window that quarantine"
    )
    quarantine_window_s: float = Field(
        default=3600.0, gt=0, description="Window the quarantine policy counts failures in"
    )
    fence_grace_s: float = Field(
        default=30.0,
        ge=0,
        description="A job running elsewhere this long is killed where a node still runs it",
    )
    heartbeat_record_s: float = Field(
        default=10.0,
        ge=0,
        description="Write a node's last heartbeat to gfair_nodes at most this often",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.suspect_after_s > self.fail_after_s:
            raise ValueError(
                f"suspect_after_s ({self.suspect_after_s:g}) must not exceed "
                f"fail_after_s ({self.fail_after_s:g})"
            )
        return self

    def heartbeat_policy(self) -> HeartbeatPolicy:
        return HeartbeatPolicy(suspect_after_s=self.suspect_after_s, fail_after_s=self.fail_after_s)

    def quarantine_policy(self) -> QuarantinePolicy:
        return QuarantinePolicy(
            max_failures=self.quarantine_failures, window_s=self.quarantine_window_s
        )

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            budgets={
                FailureClass.USER_ERROR: self.user_error_retries,
                FailureClass.OUT_OF_MEMORY: self.oom_retries,
                FailureClass.INFRASTRUCTURE: self.infrastructure_retries,
            },
            backoff=BackOff(
                base_s=self.retry_base_s,
                factor=self.retry_factor,
                cap_s=self.retry_cap_s,
                jitter=self.retry_jitter,
            ),
        )
