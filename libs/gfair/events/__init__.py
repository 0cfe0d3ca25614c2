"""gfair.events: the typed event contract (docs/design.md §3.2).

Importing the package registers every event type of the contract, so `registered_types()` and
`decode()` know them all whichever module a caller imports first.
"""

from gfair.events.codec import DecodedEvent, decode, encode, publish_headers, verify_subject
from gfair.events.commands import (
    KillCommand,
    MigrateCommand,
    NodeCommand,
    PrepareCommand,
    ResumeCommand,
    StartCommand,
    SuspendCommand,
)
from gfair.events.envelope import MSG_ID_HEADER, Envelope, EventData
from gfair.events.errors import InvalidEvent, describe_validation_error
from gfair.events.fields import JobRef
from gfair.events.jobs import (
    JobAccepted,
    JobCancelled,
    JobCheckpointed,
    JobCompleted,
    JobEvent,
    JobExited,
    JobFailed,
    JobMigrated,
    JobPlaced,
    JobProgress,
    JobRejected,
    JobResumed,
    JobRetried,
    JobStarted,
    JobSuspended,
)
from gfair.events.nodes import (
    GpuInfo,
    GpuSample,
    NodeEvent,
    NodeFailed,
    NodeHeartbeat,
    NodeQuarantined,
    NodeRecovered,
    NodeRegistered,
    NodeSuspected,
    NodeTelemetry,
    NodeUncordoned,
)
from gfair.events.reasons import FailureClass, MigrationReason, RejectionCode, SuspendReason
from gfair.events.registry import (
    UnknownEventType,
    decode_data,
    model_for,
    register,
    registered_types,
)
from gfair.events.scheduling import (
    EntitlementsUpdated,
    ProfileUpdated,
    QuantumTicked,
    SchedEvent,
    ScheduleDecided,
    TradeCleared,
)
from gfair.events.states import JobState, NodeState
from gfair.events.submission import JobCancelRequested, JobSubmitted, new_job_id

__all__ = [
    "MSG_ID_HEADER",
    "DecodedEvent",
    "EntitlementsUpdated",
    "Envelope",
    "EventData",
    "FailureClass",
    "GpuInfo",
    "GpuSample",
    "InvalidEvent",
    "JobAccepted",
    "JobCancelRequested",
    "JobCancelled",
    "JobCheckpointed",
    "JobCompleted",
    "JobEvent",
    "JobExited",
    "JobFailed",
    "JobMigrated",
    "JobPlaced",
    "JobProgress",
    "JobRef",
    "JobRejected",
    "JobResumed",
    "JobRetried",
    "JobStarted",
    "JobState",
    "JobSubmitted",
    "JobSuspended",
    "KillCommand",
    "MigrateCommand",
    "MigrationReason",
    "NodeCommand",
    "NodeEvent",
    "NodeFailed",
    "NodeHeartbeat",
    "NodeQuarantined",
    "NodeRecovered",
    "NodeRegistered",
    "NodeState",
    "NodeSuspected",
    "NodeTelemetry",
    "NodeUncordoned",
    "PrepareCommand",
    "ProfileUpdated",
    "QuantumTicked",
    "RejectionCode",
    "ResumeCommand",
    "SchedEvent",
    "ScheduleDecided",
    "StartCommand",
    "SuspendCommand",
    "SuspendReason",
    "TradeCleared",
    "UnknownEventType",
    "decode",
    "decode_data",
    "describe_validation_error",
    "encode",
    "model_for",
    "new_job_id",
    "publish_headers",
    "register",
    "registered_types",
    "verify_subject",
]
