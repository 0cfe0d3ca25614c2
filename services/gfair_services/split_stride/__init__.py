"""The split-stride service: per-quantum time-slicing of every server (docs/design.md §2.3)."""

from .service import SplitStrideService, build_service
from .settings import SplitStrideSettings

Settings = SplitStrideSettings  # what `gfair service` looks up

__all__ = ["Settings", "SplitStrideService", "SplitStrideSettings", "build_service"]
