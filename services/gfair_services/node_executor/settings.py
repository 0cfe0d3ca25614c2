"""Settings of a node executor (environment `GFAIR_*`, or flags of `gfair service`)."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Literal, Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from gfair.core.cluster import parse_cluster_spec
from gfair.events.fields import TOKEN_REGEX
from gfair.node.job_account import (
    DEFAULT_JOB_UID_BASE,
    JOB_UID_RANGE,
    AccountError,
    JobAccount,
    check_uid_base,
    derived_account,
    parse_accounts,
)
from gfair.node.job_cgroup import AUTO, CgroupError, locate
from gfair.node.job_disk import OUTPUT_MAX_BYTES
from gfair.node.job_limits import JobLimits, LimitError, check_host, parse_size
from gfair.node.progress import ProgressLimits
from gfair.node.simulated import parse_gpu_spec
from gfair_services.containers import ContainerSettings
from gfair_services.skeleton import QuantumSettings

# The same default as split-stride's, so a one-machine cluster needs no flag to agree on where
# checkpoints are; a real cluster points both at a shared filesystem.
DEFAULT_CHECKPOINT_ROOT = Path("/tmp/gfair/checkpoints")
DEFAULT_WORK_ROOT = Path("/tmp/gfair/nodes")  # <this>/<node_id>
# Virtual servers per process: at 100, one process's event loop keeps up with its nodes'
# commands, heartbeats and progress reports at 60 s quanta (docs/benchmarks.md); 1,000 on one
# connection and loop fell behind the broker and were cut off as a slow consumer.
DEFAULT_VIRTUAL_NODES_PER_PROCESS = 100
_PROGRESS = ProgressLimits()


def default_node_id() -> str:
    """The host name, squeezed into a subject token (`gpu-07.rack3` -> `gpu-07-rack3`)."""
    token = re.sub(r"[^A-Za-z0-9_-]+", "-", socket.gethostname()).strip("-")[:64]
    return token or "node"


def progress_interval_for(quantum_s: float) -> float:
    """The default progress interval at `quantum_s` quanta: a sixth of it, from 1 to 10 s."""
    return min(max(quantum_s / 6, 1.0), 10.0)


class NodeExecutorSettings(ContainerSettings, QuantumSettings):
    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

    node_id: str = Field(
        default_factory=default_node_id,
        pattern=TOKEN_REGEX,
        description="This server's id in the cluster (default: the host name)",
    )
    simulate_gpus: str | None = Field(
        default=None,
        description="Simulate GPUs, e.g. v100:4 or v100:4,k80:2; default: real GPUs via NVML",
    )
    checkpoint_root: Path = Field(
        default=DEFAULT_CHECKPOINT_ROOT,
        description="Shared checkpoint root: a job checkpoints to <root>/<user>/<job_id>",
    )
    work_root: Path | None = Field(
        default=None,
        description="This executor's run directories and records (None: <work base>/<id>)",
    )
    work_base: Path = Field(
        default=DEFAULT_WORK_ROOT,
        description="Where executors keep their work roots, one per node id (a volume several "
        "executors share, each in its own directory)",
    )
    heartbeat_s: float = Field(default=5.0, gt=0, description="Heartbeat interval")
    telemetry_s: float = Field(default=10.0, gt=0, description="GPU telemetry interval")
    command_wait_s: float = Field(
        default=10.0,
        gt=0,
        description="How long a pull for this node's commands waits at the broker. A command "
        "answers it at once, so this sets only the traffic of an idle node (a pull this often) "
        "and how soon a command consumer deleted under it is noticed (a second after)",
    )
    suspend_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="How long a job may take to checkpoint and yield before it is forced "
        "(SIGTERM, then SIGKILL after term_grace_s), for drains and suspends that carry no "
        "grace; the scheduler's suspends carry theirs (split-stride's GFAIR_YIELD_GRACE_S), "
        "past which the job is killed outright and resumes from its last checkpoint",
    )
    resume_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="How long a job parked in place may take to resume (to its first "
        "mini-batch) before it is stopped and started anew from its checkpoint",
    )
    prepare_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="How long a prepared start (a job submitted with prepare, started before "
        "it has GPUs) may take to park in Job.from_env(); past it the process is killed (it "
        "does not use the SDK as promised) and the job starts normally when its turn comes",
    )
    term_grace_s: float = Field(
        default=5.0, gt=0, description="Between SIGTERM and SIGKILL when a job must stop"
    )
    progress_interval_s: float | None = Field(
        default=None,
        gt=0,
        description="At most one progress report per job this often (default: a sixth of the "
        "quantum, from 1 to 10 s)",
    )
    output_interval_s: float = Field(
        default=1.0, gt=0, description="How often jobs' new stdout/stderr is shipped to NATS"
    )
    progress_read_bytes: int = Field(
        default=_PROGRESS.read_bytes,
        gt=0,
        description="At most this much of a job's progress file is read at a time; unread "
        "bytes beyond GFAIR_PROGRESS_BACKLOG_BYTES are skipped (only the newest records matter)",
    )
    progress_backlog_bytes: int = Field(
        default=_PROGRESS.backlog_bytes,
        gt=0,
        description="Unread progress a job may have before what is older is skipped",
    )
    progress_line_max_bytes: int = Field(
        default=_PROGRESS.max_line_bytes,
        gt=0,
        description="A longer line of a job's progress file is skipped and counted as malformed",
    )
    progress_records_per_s: float = Field(
        default=_PROGRESS.records_per_s,
        gt=0,
        description="Records of a job's progress file kept per second (runs of steps count as "
        "their first and last); more are dropped and counted",
    )
    job_output_max_bytes: int = Field(
        default=OUTPUT_MAX_BYTES,
        gt=0,
        description="What a run's stdout.log and stderr.log each keep on the node and ship to "
        "NATS; past it the file is cut back to this with a note saying so, and the rest of the "
        "job's output is not kept",
    )
    job_disk_max_bytes: int | None = Field(
        default=20 << 30,
        gt=0,
        description="What one job may keep on the node's disk under its run directory (its "
        "runs' records and output, its default working directory), measured every "
        "job_disk_check_s; past it the job is killed as its own failure, with a note in its "
        "stderr. None: no cap",
    )
    job_disk_check_s: float = Field(
        default=30.0, gt=0, description="How often each job's disk use is measured"
    )
    run_retention_s: float = Field(
        default=7 * 86400.0,
        gt=0,
        description="How long the run directories of jobs that no longer run here are kept "
        "(their output was shipped to NATS); then they go, with their working directory",
    )
    command_max_age_s: float = Field(
        default=120.0,
        gt=0,
        description="Start commands older than this are stale (the job was re-placed meanwhile)",
    )

    job_accounts: str = Field(
        default="",
        description="OS accounts tenants' jobs run as, when the executor runs as root: "
        "'alice=20001,bob=20002:20002,carol=some-os-user' ('*=' names the account of every "
        "other tenant); a tenant not named gets its own uid from GFAIR_JOB_UID_BASE. Jobs "
        "never run as root; an executor that is not root runs them as its own user",
    )
    job_uid_base: int = Field(
        default=DEFAULT_JOB_UID_BASE,
        description="An executor running as root runs the jobs of each tenant GFAIR_JOB_ACCOUNTS "
        f"does not name as uid and gid <base> + sha256(tenant) mod {JOB_UID_RANGE}: the same "
        "number on every node and after every restart, no /etc/passwd entry needed (keep "
        "the range free of other users); two tenants on one uid are refused",
    )
    job_pids_max: int = Field(
        default=4096,
        ge=0,
        description="Processes and threads one job may have (cgroup pids.max; a fork beyond "
        "fails); 0: no limit. Where the host has no pids controller for the executor, the "
        "default is skipped with a warning and a value set explicitly stops the executor",
    )

    job_cgroups: str = Field(
        default=AUTO,
        description="Where each job gets a cgroup (v2) of its own, so that every process it "
        "starts goes with it: 'auto' (under the executor's own cgroup, when the host lets it "
        "make cgroups there), 'off', or a writable cgroup2 directory",
    )

    job_memory_per_gpu: str = Field(
        default="",
        description="Memory a job may use per GPU it holds on this node, e.g. '16G' (cgroup "
        "memory limit; over it the kernel kills the job, reported as out-of-memory); empty: "
        "no limit",
    )
    job_cpus_per_gpu: float | None = Field(
        default=None,
        gt=0,
        description="CPUs a job may use per GPU it holds on this node, e.g. 6 (cgroup CPU "
        "quota; over it the job is throttled); unset: no limit",
    )

    job_threads: Literal["share", "off"] = Field(
        default="share",
        description="'share': a job starts with OMP_NUM_THREADS (PyTorch's, MKL's and "
        "OpenBLAS's thread pools) set to its share of this node's CPUs, job_cpus_per_gpu (or "
        "the node's CPUs over its GPUs) times its GPUs, unless it sets it itself; 'off': the "
        "libraries' defaults, one thread per CPU of the machine for every job",
    )

    virtual_nodes: str = Field(
        default="",
        description="Run, in this one process, a virtual node executor for every server of "
        "this cluster spec (e.g. v100:50x8,k80:50x8; node ids as gfair up's: v100-0, ...), "
        "each with its own heartbeats and commands, their jobs virtual: no process per job, "
        "progress at the synthetic job's speed (only `python -m gfair.sdk.synthetic` jobs "
        "run), for scale and load tests; empty: this process is the one node --node-id",
    )

    virtual_nodes_per_process: int = Field(
        default=DEFAULT_VIRTUAL_NODES_PER_PROCESS,
        ge=1,
        description="With virtual_nodes: servers of the spec one process runs, each part on a "
        "NATS connection of its own; a spec of more servers runs in several processes (one per "
        "part: virtual_part, or all of them started and restarted by this process)",
    )

    virtual_part: int | None = Field(
        default=None,
        ge=0,
        description="With virtual_nodes: run only this part of the spec's servers (0 for the "
        "first virtual_nodes_per_process of them, 1 for the next, ...), for deployments that "
        "run each part as a process of their own; unset: every part, one process each",
    )

    parked_memory: str = Field(
        default="8G",
        description="Host memory all jobs parked in place on this node may hold together (their "
        "processes' RSS), e.g. '32G'; beyond it the longest-parked one checkpoints and exits "
        "(its next start is from the checkpoint); '0': no job parks in place, every suspend "
        "checkpoints and exits",
    )

    @property
    def parked_memory_bytes(self) -> int:
        text = self.parked_memory.strip()
        return 0 if text in ("", "0") else parse_size(text)

    @field_validator("parked_memory")
    @classmethod
    def _parked(cls, value: str) -> str:
        value = value.strip()
        if value not in ("", "0"):
            try:
                parse_size(value)
            except LimitError as error:
                raise ValueError(str(error)) from None
        return value

    @field_validator("job_memory_per_gpu")
    @classmethod
    def _memory(cls, value: str) -> str:
        value = value.strip()
        if value:
            try:
                parse_size(value)
            except LimitError as error:
                raise ValueError(str(error)) from None
        return value

    @model_validator(mode="after")
    def _enforceable(self) -> Self:
        # A limit the host cannot enforce stops the executor at start, with the reason.
        if not self.job_limits.controllers:
            return self  # nothing to look for in the host's cgroups
        try:
            check_host(self.job_limits, locate(self.job_cgroups))
        except (LimitError, CgroupError) as error:
            raise ValueError(str(error)) from None
        return self

    @property
    def progress_every_s(self) -> float:
        """How often a running job reports its progress: a few times a slice. Every report is
        read by the profiler and the failure detector: at a thousand servers, one a second
        per job was more than the services of a small control plane could read."""
        if self.progress_interval_s is not None:
            return self.progress_interval_s
        return progress_interval_for(self.quantum_s)

    @property
    def progress_limits(self) -> ProgressLimits:
        return ProgressLimits(
            read_bytes=self.progress_read_bytes,
            max_line_bytes=self.progress_line_max_bytes,
            records_per_s=self.progress_records_per_s,
            backlog_bytes=self.progress_backlog_bytes,
        )

    @property
    def job_limits(self) -> JobLimits:
        memory = parse_size(self.job_memory_per_gpu) if self.job_memory_per_gpu else None
        pids = self.job_pids_max or None
        if pids is not None and "job_pids_max" not in self.model_fields_set:
            try:
                check_host(JobLimits(pids_max=pids), locate(self.job_cgroups))
            except (LimitError, CgroupError):
                pids = None  # the default asks only where the host can (module doc)
        return JobLimits(memory_per_gpu=memory, cpus_per_gpu=self.job_cpus_per_gpu, pids_max=pids)

    @field_validator("job_uid_base")
    @classmethod
    def _uid_base(cls, value: int) -> int:
        try:
            return check_uid_base(value)
        except AccountError as error:
            raise ValueError(str(error)) from None

    @field_validator("job_cgroups")
    @classmethod
    def _cgroups(cls, value: str) -> str:
        value = value.strip() or AUTO
        try:
            locate(value)
        except CgroupError as error:
            raise ValueError(str(error)) from None
        return value

    @field_validator("job_accounts")
    @classmethod
    def _accounts(cls, value: str) -> str:
        accounts = parse_job_accounts(value)
        if accounts and os.geteuid() != 0:
            raise ValueError("job_accounts: only an executor running as root can run jobs as them")
        return value.strip()

    @property
    def accounts(self) -> dict[str, JobAccount]:
        return parse_job_accounts(self.job_accounts)

    def account_for(self, user: str) -> JobAccount | None:
        """The account `user`'s jobs run as: its own, else '*', else one derived from its name
        (`derived_account`); None where the executor is not root (its jobs run as itself)."""
        if os.geteuid() != 0:
            return None
        accounts = self.accounts
        account = accounts.get(user) or accounts.get("*")
        return account or derived_account(user, self.job_uid_base)

    @field_validator("virtual_nodes")
    @classmethod
    def _virtual(cls, value: str) -> str:
        value = value.strip()
        if value:
            parse_cluster_spec(value)
        return value

    @field_validator("simulate_gpus")
    @classmethod
    def _spec(cls, value: str | None) -> str | None:
        if value is not None and value.strip():
            parse_gpu_spec(value)
            return value.strip()
        return None

    @field_validator("checkpoint_root", "work_root", "work_base")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        # Paths travel in events (checkpoint paths), which require them absolute.
        return value.expanduser().absolute() if value is not None else None

    @model_validator(mode="after")
    def _part(self) -> Self:
        if self.virtual_part is None:
            return self
        if not self.virtual_nodes:
            raise ValueError("virtual_part: give virtual_nodes, the spec it is a part of")
        servers = len(parse_cluster_spec(self.virtual_nodes).servers)
        parts = -(-servers // self.virtual_nodes_per_process)
        if self.virtual_part >= parts:
            raise ValueError(
                f"virtual_part {self.virtual_part}: {servers} servers at "
                f"{self.virtual_nodes_per_process} per process make {parts} parts (0..{parts - 1})"
            )
        return self

    @model_validator(mode="after")
    def _work_root(self) -> Self:
        if self.work_root is None:
            self.work_root = self.work_base / self.node_id
        return self

    @property
    def work_dir(self) -> Path:
        assert self.work_root is not None  # filled in by the validator
        return self.work_root

    def checkpoint_dir(self, user: str, job_id: str) -> Path:
        return self.checkpoint_root / user / job_id


def parse_job_accounts(text: str) -> dict[str, JobAccount]:
    """`GFAIR_JOB_ACCOUNTS`: comma-separated ``tenant=account`` (see `job_account`)."""
    entries: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        tenant, sep, account = item.partition("=")
        tenant, account = tenant.strip(), account.strip()
        if not sep or not account or not (tenant == "*" or re.fullmatch(TOKEN_REGEX, tenant)):
            raise ValueError(f"job_accounts: {item!r} is not tenant=uid[:gid] or tenant=os-user")
        if tenant in entries:
            raise ValueError(f"job_accounts: tenant {tenant} is named twice")
        entries[tenant] = account
    return parse_accounts(entries)
