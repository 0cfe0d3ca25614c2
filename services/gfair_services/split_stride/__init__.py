"""The split-stride service: per-quantum time-slicing of every server (docs/design.md §2.3)."""

from .service import SplitStrideService, build_service
from .settings import Settings

__all__ = ["Settings", "SplitStrideService", "build_service"]
