"""One realistic example of every event type.

They are published inside the JSON Schemas (`examples`) so a tool author sees a valid message
next to its rules, and the tests decode each one, so the documentation cannot drift from the
models. The job ids, times and event ids are fixed so the generated schemas are reproducible.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType

from gfair.events.commands import (
    KillCommand,
    MigrateCommand,
    PrepareCommand,
    ResumeCommand,
    StartCommand,
    SuspendCommand,
)
from gfair.events.envelope import Envelope, EventData
from gfair.events.fields import JobRef
from gfair.events.jobs import (
    JobAccepted,
    JobCancelled,
    JobCheckpointed,
    JobCompleted,
    JobExited,
    JobFailed,
    JobHeld,
    JobLaunch,
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
from gfair.events.scheduling import (
    EntitlementsUpdated,
    ProfileUpdated,
    QuantumTicked,
    ScheduleDecided,
    SharesChanged,
    SwitchCostsUpdated,
    TradeCleared,
)
from gfair.events.states import JobState
from gfair.events.submission import JobCancelRequested, JobSubmitted

EXAMPLE_TIME = datetime(2025, 3, 14, 9, 26, 53, tzinfo=UTC)
_USER = "alice"
_JOB = "resnet50-sweep-3f9c2a"
_NODE = "gpu-node-07"
_JOB_REF = JobRef(user=_USER, job_id=_JOB)
_GIB = 1024**3

_EXAMPLES: tuple[EventData, ...] = (
    JobSubmitted(
        user=_USER,
        job_id=_JOB,
        gpus=2,
        command=("python", "train.py", "--model", "resnet50", "--lr", "0.1"),
        job_type="ResNet-50 (batch size 64)",
        name="resnet50 lr=0.1",
        env={"WANDB_MODE": "offline"},
        working_dir="/home/alice/sweep",
        max_retries=3,
    ),
    JobCancelRequested(user=_USER, job_id=_JOB, reason="superseded by a better learning rate"),
    JobAccepted(
        user=_USER,
        job_id=_JOB,
        gpus=2,
        job_type="ResNet-50 (batch size 64)",
        launch=JobLaunch(
            command=("python", "train.py", "--model", "resnet50", "--lr", "0.1"),
            env={"WANDB_MODE": "offline"},
            working_dir="/home/alice/sweep",
        ),
    ),
    JobHeld(user=_USER, job_id=_JOB, gpus=2, waiting_on=("preprocess-imagenet",)),
    JobRejected(
        user=_USER,
        job_id=_JOB,
        code=RejectionCode.UNSATISFIABLE,
        reason="asks for 512 GPUs; the largest pool has 256",
    ),
    JobPlaced(user=_USER, job_id=_JOB, servers=(_NODE,), generation="v100"),
    JobStarted(user=_USER, job_id=_JOB, node_id=_NODE, gpu_indices=(2, 3), attempt=1),
    JobProgress(
        user=_USER,
        job_id=_JOB,
        node_id=_NODE,
        generation="v100",
        attempt=1,
        minibatches_per_s=11.6,
        iterations=4200,
        checkpoint_step=4000,
        window_s=30.0,
    ),
    JobSuspended(
        user=_USER,
        job_id=_JOB,
        node_id=_NODE,
        attempt=1,
        reason=SuspendReason.TIME_SLICE,
        checkpoint_step=4300,
        duration_s=0.42,
    ),
    JobResumed(
        user=_USER,
        job_id=_JOB,
        node_id=_NODE,
        gpu_indices=(0, 1),
        attempt=1,
        checkpoint_step=4300,
        duration_s=0.61,
    ),
    JobMigrated(
        user=_USER,
        job_id=_JOB,
        from_node=_NODE,
        to_node="gpu-node-12",
        reason=MigrationReason.LOAD_BALANCE,
        attempt=1,
        checkpoint_step=5100,
    ),
    JobCheckpointed(
        user=_USER,
        job_id=_JOB,
        node_id=_NODE,
        attempt=1,
        step=5000,
        path="/var/lib/gfair/checkpoints/alice/resnet50-sweep-3f9c2a/step-5000.pt",
        size_bytes=97_812_345,
        duration_s=0.8,
    ),
    JobExited(
        user=_USER,
        job_id=_JOB,
        node_id=_NODE,
        attempt=1,
        exit_code=1,
        runtime_s=812.5,
        stderr_tail="torch.cuda.OutOfMemoryError: CUDA out of memory.",
    ),
    JobCompleted(user=_USER, job_id=_JOB, attempt=2, runtime_s=7260.0, iterations=90_000),
    JobFailed(
        user=_USER,
        job_id=_JOB,
        failure_class=FailureClass.USER_ERROR,
        reason="exited 1 after 3.2 s on two attempts: ModuleNotFoundError",
        attempt=2,
        node_id=_NODE,
        exit_code=1,
        stderr_tail="ModuleNotFoundError: No module named 'torchvision'",
    ),
    JobRetried(
        user=_USER,
        job_id=_JOB,
        attempt=2,
        delay_s=30.0,
        failure_class=FailureClass.INFRASTRUCTURE,
        reason="node gpu-node-07 failed",
        resume_from_step=5000,
    ),
    JobCancelled(
        user=_USER,
        job_id=_JOB,
        previous_state=JobState.RUNNING,
        reason="superseded by a better learning rate",
    ),
    NodeRegistered(
        node_id=_NODE,
        hostname="gpu-node-07.cluster.local",
        gpus=tuple(
            GpuInfo(
                index=i,
                uuid=f"GPU-5b8e1c2d-0000-4000-8000-00000000000{i}",
                name="Tesla V100-SXM2-16GB",
                generation="v100",
                memory_bytes=16 * _GIB,
            )
            for i in range(4)
        ),
        heartbeat_interval_s=2.0,
        executor_version="0.1.0",
    ),
    NodeHeartbeat(node_id=_NODE, seq=1234, running=(_JOB_REF,)),
    NodeTelemetry(
        node_id=_NODE,
        gpus=(
            GpuSample(
                index=2,
                utilization_pct=97.0,
                memory_used_bytes=14 * _GIB,
                temperature_c=71.0,
                power_w=281.5,
            ),
            GpuSample(
                index=3,
                utilization_pct=0.0,
                memory_used_bytes=0,
                temperature_c=44.0,
                xid_events=(79,),
            ),
        ),
    ),
    NodeSuspected(node_id=_NODE, missed_heartbeats=3, last_heartbeat=EXAMPLE_TIME),
    NodeFailed(
        node_id=_NODE,
        reason="no heartbeat for 30 s",
        last_heartbeat=EXAMPLE_TIME,
        jobs=(_JOB_REF,),
    ),
    NodeRecovered(node_id=_NODE, reason="heartbeats resumed"),
    NodeQuarantined(node_id=_NODE, reason="3 jobs lost to XID 79 in 1 h", recent_failures=3),
    NodeUncordoned(node_id=_NODE, operator="ops-oncall", reason="GPU 3 replaced"),
    StartCommand(
        node_id=_NODE,
        user=_USER,
        job_id=_JOB,
        attempt=1,
        command=("python", "train.py", "--model", "resnet50", "--lr", "0.1"),
        env={"WANDB_MODE": "offline"},
        working_dir="/home/alice/sweep",
        gpu_indices=(2, 3),
        checkpoint_dir="/var/lib/gfair/checkpoints/alice/resnet50-sweep-3f9c2a",
    ),
    PrepareCommand(
        node_id=_NODE,
        user=_USER,
        job_id=_JOB,
        attempt=1,
        command=("python", "train.py", "--model", "resnet50", "--lr", "0.1"),
        env={"WANDB_MODE": "offline"},
        working_dir="/home/alice/sweep",
        gpus=2,
        generation="v100",
        checkpoint_dir="/var/lib/gfair/checkpoints/alice/resnet50-sweep-3f9c2a",
    ),
    SuspendCommand(node_id=_NODE, user=_USER, job_id=_JOB, attempt=1),
    ResumeCommand(node_id=_NODE, user=_USER, job_id=_JOB, attempt=1, gpu_indices=(0, 1)),
    MigrateCommand(
        node_id=_NODE,
        user=_USER,
        job_id=_JOB,
        attempt=1,
        to_node="gpu-node-12",
        reason=MigrationReason.LOAD_BALANCE,
    ),
    KillCommand(node_id=_NODE, user=_USER, job_id=_JOB, attempt=1, reason="cancelled by alice"),
    QuantumTicked(quantum=1440, starts_at=EXAMPLE_TIME, length_s=60.0),
    ScheduleDecided(
        quantum=1440,
        server=_NODE,
        running=(_JOB_REF, JobRef(user="bob", job_id="bert-finetune-01")),
    ),
    ProfileUpdated(
        user=_USER,
        job_id=_JOB,
        job_type="ResNet-50 (batch size 64)",
        rates={"k80": 1.9, "p100": 6.1, "v100": 11.6},
        baseline="k80",
        speedups={"k80": 1.0, "p100": 3.2, "v100": 6.1},
        observed=("v100",),
    ),
    SwitchCostsUpdated(
        user=_USER,
        job_id=_JOB,
        reports=9,
        yield_s=0.8,
        resume_in_place_s=0.15,
        cold_start_s=14.2,
        checkpoint_bytes=2 * _GIB,
    ),
    EntitlementsUpdated(
        revision=17,
        entitlements={
            "alice": {"k80": 2.0, "v100": 6.0},
            "bob": {"k80": 6.0, "v100": 2.0},
        },
    ),
    SharesChanged(
        operator="ops-oncall",
        reason="the vision team grows",
        shares='[accounts.research]\ntickets = 3.0\n[accounts."research/vision"]\n'
        'tickets = 2.0\n[users.alice]\naccount = "research/vision"\ntickets = 1.0\n',
        changes=("account research/vision: tickets 1 -> 2",),
    ),
    TradeCleared(
        buyer="alice",
        seller="bob",
        fast_pool="v100",
        slow_pool="k80",
        quantity=2.0,
        price=2.0,
        bids={"alice": 6.0, "bob": 1.2, "carol": 2.0},
    ),
)

EXAMPLES: Mapping[str, EventData] = MappingProxyType({e.EVENT_TYPE: e for e in _EXAMPLES})


def example_envelope(data: EventData) -> Envelope:
    """`data` as a complete message, with a fixed id and time so output is reproducible."""
    return Envelope.wrap(
        data,
        source="gfair-example",
        event_id=uuid.uuid5(uuid.NAMESPACE_URL, data.EVENT_TYPE).hex,
        time=EXAMPLE_TIME,
    )
