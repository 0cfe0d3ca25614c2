"""The failure detector: node liveness, quarantine, exit classes, retries (docs/design.md §2.6)."""

from gfair_services.failure_detector.service import (
    SERVICE_NAME,
    FailureDetector,
    build_service,
)
from gfair_services.failure_detector.settings import FailureDetectorSettings

Settings = FailureDetectorSettings

__all__ = [
    "SERVICE_NAME",
    "FailureDetector",
    "FailureDetectorSettings",
    "Settings",
    "build_service",
]
