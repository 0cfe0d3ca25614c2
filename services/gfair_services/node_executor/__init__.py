"""The node executor: runs jobs on one GPU server's GPUs for the scheduler (docs/design.md §3.1)."""

from gfair_services.node_executor.executor import SERVICE_NAME, NodeExecutor
from gfair_services.node_executor.run_control import CANNOT_START_EXIT_CODE
from gfair_services.node_executor.service import build_service, serve
from gfair_services.node_executor.settings import NodeExecutorSettings

Settings = NodeExecutorSettings

__all__ = [
    "CANNOT_START_EXIT_CODE",
    "SERVICE_NAME",
    "NodeExecutor",
    "NodeExecutorSettings",
    "Settings",
    "build_service",
    "serve",
]
