"""The profiler: measured mini-batch rates per job, user and GPU generation.

See docs/design.md §2.4.
"""

from gfair_services.profiler.service import SERVICE_NAME, Profiler, build_service
from gfair_services.profiler.settings import ProfilerSettings

Settings = ProfilerSettings

__all__ = ["SERVICE_NAME", "Profiler", "ProfilerSettings", "Settings", "build_service"]
