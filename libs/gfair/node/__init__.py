"""gfair.node: what a node executor needs, with no bus in sight.

GPU discovery and telemetry (NVML or simulated), and a supervisor that runs jobs as process
groups on those GPUs and suspends them through checkpoints. The node-executor service turns
the plain results and events here into bus events.
"""

from gfair.node.discovery import open_gpus
from gfair.node.gpu import GpuBackend, GpuDevice, GpuReading, NoGpusError, XidError
from gfair.node.job_runner import (
    JobNotSupervised,
    JobRunner,
    JobStartError,
    SupervisorConfig,
    SupervisorError,
)
from gfair.node.launch import CheckpointRef, JobPaths, RunningJob, RunSpec
from gfair.node.lifecycle import (
    CheckpointReport,
    ExitReport,
    JobEvent,
    ProgressReport,
    SuspendResult,
)
from gfair.node.orphans import ReapedRun
from gfair.node.supervisor import JobSupervisor
from gfair.node.telemetry import TelemetryReport, telemetry_reports

__all__ = [
    "CheckpointRef",
    "CheckpointReport",
    "ExitReport",
    "GpuBackend",
    "GpuDevice",
    "GpuReading",
    "JobEvent",
    "JobNotSupervised",
    "JobPaths",
    "JobRunner",
    "JobStartError",
    "JobSupervisor",
    "NoGpusError",
    "ProgressReport",
    "ReapedRun",
    "RunSpec",
    "RunningJob",
    "SupervisorConfig",
    "SupervisorError",
    "SuspendResult",
    "TelemetryReport",
    "XidError",
    "open_gpus",
    "telemetry_reports",
]
