"""The placement service: admission and the job records."""

from .service import PlacementService, build_service
from .settings import PlacementSettings

Settings = PlacementSettings  # what `gfair service` looks up

__all__ = ["PlacementService", "PlacementSettings", "Settings", "build_service"]
