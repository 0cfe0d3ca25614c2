"""The placement service: admission, pool and server choice, re-placement, load balancing."""

from .service import PlacementService, build_service
from .settings import Settings

__all__ = ["PlacementService", "Settings", "build_service"]
