"""The placement service: admission and the job records."""

from .service import PlacementService, build_service
from .settings import Settings

__all__ = ["PlacementService", "Settings", "build_service"]
