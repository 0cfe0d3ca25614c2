"""The node executor: one per GPU server, a thin shell over `gfair.node` and the bus.

It registers the server's GPUs, heartbeats, samples telemetry, and carries out the commands
on `gfair.cmd.<node_id>.*` concurrently where they touch other jobs and other GPUs, and in
order where they do, so that a suspend has finished (its checkpoint written, its GPUs free,
its report published) before the next start on the same GPUs (`JobCommands.lanes`).
Job processes are run by one `JobSupervisor` per user (`user_supervisors`), or, on a virtual
node, virtual jobs without processes (`gfair.node.job_host`, `virtual_nodes`); what they report
is relayed as job events (`report_relay`).

Ordering of a job's events: a run's `started`/`resumed` is published before any of its reports,
and a `suspended` or `migrated` after the run's last checkpoint (`run_control`). This is why
commands publish their events themselves, through the sink the relay also uses
(`event_sink`), instead of returning them to the runtime: the runtime would publish them only
after the handler returned, possibly after reports of the run they announce. Events of a
command carry ids derived from the command's, so a redelivered command publishes nothing twice.

An exit the scheduler did not ask for is reported as `exited` for the failure detector to
classify; a stop it asked for is reported as `suspended`/`migrated` (or, for a kill, not at
all: whoever asked for the kill decided what comes next).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import anyio.to_thread
import structlog
from opentelemetry import trace

import gfair
from gfair.bus.metrics import gfair_metrics
from gfair.bus.runtime import ServiceRuntime
from gfair.bus.service import Emit, Service, Unprocessable
from gfair.bus.topology import ConsumerSpec
from gfair.events.commands import ResumeCommand, StartCommand
from gfair.events.envelope import Envelope
from gfair.events.fields import MAX_STDERR_TAIL_CHARS, JobRef
from gfair.events.jobs import JobExited, JobSuspended
from gfair.events.nodes import NodeHeartbeat, NodeRegistered, NodeTelemetry
from gfair.events.reasons import SuspendReason
from gfair.events.subjects import node_commands_pattern, stream_for_subject
from gfair.node import device_program
from gfair.node.discovery import open_gpus
from gfair.node.gpu import GpuBackend, GpuReading, XidError
from gfair.node.job_account import JobAccount, check_distinct, owners_of
from gfair.node.job_cgroup import AUTO, CgroupError, CgroupTree, locate, tenant_directory
from gfair.node.job_host import JobHost, ProcessHost
from gfair.node.job_limits import DEVICES, LimitTree, v1_hierarchies
from gfair.node.job_runner import SupervisorConfig
from gfair.node.job_threads import threads_per_gpu
from gfair.node.orphans import ReapedRun, RunEnd
from gfair.node.run_directory import PASSAGE_MODE
from gfair_services.node_executor.event_sink import EventSink, count_from_zero, count_suspend
from gfair_services.node_executor.gpu_report import XidLog, inventory_event, telemetry_samples
from gfair_services.node_executor.job_commands import Command, JobCommands
from gfair_services.node_executor.local_job import LocalJob, RunTable
from gfair_services.node_executor.report_relay import ReportRelay
from gfair_services.node_executor.run_control import RunControl
from gfair_services.node_executor.settings import NodeExecutorSettings

if TYPE_CHECKING:
    from gfair.node.container_jobs import ContainerOptions
from gfair_services.node_executor.user_supervisors import UserSupervisors
from gfair_services.topology import cluster_topology

SERVICE_NAME = "node-executor"
# How often a container node asks its engine whether it answers, for its heartbeats to carry.
ENGINE_PROBE_S = 5.0
# Commands carried out at once at most (the runner's batch): a quantum's switches on a server.
COMMANDS_IN_FLIGHT = 32

_log = structlog.get_logger("gfair.services.node_executor")
_tracer = trace.get_tracer("gfair.services.node_executor")


class NodeExecutor:
    def __init__(
        self,
        settings: NodeExecutorSettings | None = None,
        *,
        gpus: GpuBackend | None = None,
        clock: Callable[[], float] = time.time,
        host: JobHost | None = None,
    ) -> None:
        self.settings = settings or NodeExecutorSettings()
        self.node_id = self.settings.node_id
        # Opened first: a server that cannot see its GPUs must fail before it joins the cluster.
        self._gpus = gpus or open_gpus(self.settings.simulate_gpus, node_id=self.node_id)
        self._inventory = {gpu.index: gpu for gpu in self._gpus.inventory()}
        self._xids = XidLog(list(self._inventory.values()))
        self._runs = RunTable()
        self._cgroup_base = locate(self.settings.job_cgroups)
        self._v1_hierarchies: dict[str, Path] | None = None  # where limits are set through v1
        self._accounts: dict[str, JobAccount] = {}  # tenant -> the account its jobs run as
        self._prepare_roots()
        _log.info(
            "job cgroups",
            node_id=self.node_id,
            under=str(self._cgroup_base) if self._cgroup_base else None,
            setting=self.settings.job_cgroups,
        )
        self._sink = EventSink()
        relay = ReportRelay(self.node_id, self._runs, self._sink, self._gpus, self._xids)
        # Where its jobs run: OS processes, or virtual ones (`virtual_nodes`).
        self._containers = None if host else self._container_options()
        host = host or ProcessHost(self._containers)
        self._supervisors = UserSupervisors(self._supervisor_config, relay, host)
        self._control = RunControl(
            self.settings, self._inventory, self._runs, self._sink, self._supervisors, host
        )
        self._commands = JobCommands(
            self.settings,
            self._inventory,
            self._runs,
            self._sink,
            self._control,
            clock,
        )
        self._heartbeat_seq = 0
        # The engine's last answer (`probe_engine`), None before the first: a heartbeat reads
        # it rather than asking the engine itself, which may take seconds to not answer.
        self._engine_fault: tuple[str | None] | None = None
        self._closed = False
        self.service = self._build()

    def _build(self) -> Service:
        service = Service(SERVICE_NAME, topology=cluster_topology())
        pattern = node_commands_pattern(self.node_id)
        consumer = ConsumerSpec(
            stream=stream_for_subject(pattern).name,
            durable=f"node-executor-{self.node_id}",
            filter_subjects=(pattern,),
            description=f"commands for node {self.node_id}, in order per job and GPU",
        )
        service.on_start(self.start)
        # In lanes: a job's commands, and those on the same GPUs, take effect in the order
        # the scheduler sent them.
        service.add_handler(self.on_command, consumer, name="command", lanes=self._commands.lanes)
        service.add_timer(self.settings.heartbeat_s, self.heartbeat, name="heartbeat")
        service.add_timer(self.settings.telemetry_s, self.telemetry, name="telemetry")
        if self._containers is not None:
            service.add_timer(ENGINE_PROBE_S, self.probe_engine, name="engine")
        return service

    def _prepare_roots(self) -> None:
        """The executor's directories, closed to jobs but for passing through: jobs of other
        accounts reach their own directories below them (run_directory.py). An executor
        running as root refuses roots its jobs' accounts could not reach (a parent closed to
        others, as a home directory often is) rather than start jobs that cannot run."""
        roots = (self.settings.work_dir / "runs", self.settings.checkpoint_root)
        for root in roots:
            root.mkdir(parents=True, exist_ok=True)
        for own in (self.settings.work_dir, *roots):
            if own.stat().st_uid == os.geteuid():
                own.chmod(PASSAGE_MODE)
        if os.geteuid() != 0:
            return  # its jobs run as itself
        for root in roots:
            closed = [p for p in (root, *root.parents) if not p.stat().st_mode & 0o001]
            if closed:
                raise RuntimeError(
                    f"jobs run as their tenants' own uids and cannot reach {root}: {closed[0]} "
                    "is closed to other users (chmod o+x it, or choose another "
                    "GFAIR_WORK_BASE/GFAIR_CHECKPOINT_ROOT, e.g. gfair up --data-dir)"
                )

    def _container_options(self) -> ContainerOptions | None:
        """How jobs run in their images here; None where the operator allows no image."""
        if not self.settings.job_images:
            return None
        try:
            from gfair.node.container_jobs import ContainerOptions, copied_sdk
        except ImportError as exc:  # an extra: the engine's client
            raise RuntimeError(
                f"GFAIR_JOB_IMAGES needs the Docker engine's client: pip install "
                f"'gfair[containers]' ({exc})"
            ) from exc

        limits = self.settings.job_limits
        pids = self.settings.job_pids_max or None  # enforced by the engine, whatever the host
        return ContainerOptions(
            refusal=self.settings.container_policy.refusal,
            limits=dataclasses.replace(limits, pids_max=pids),
            gpu_requests=self.settings.simulate_gpus is None,
            # Beside the run directories: where an executor in a container has them, the
            # engine's host has them too, at the same paths.
            sdk=copied_sdk(self.settings.work_dir / "job-sdk"),
        )

    def _account(self, user: str) -> JobAccount | None:
        """The account `user`'s jobs run as, refused where a derived one would be another
        tenant's too (on this node, in the configuration, or in the shared checkpoint root)."""
        account = self.settings.account_for(user)
        explicit = self.settings.accounts
        if account is None or user in explicit or "*" in explicit:
            return account
        known = {t: a for t, a in explicit.items() if t != "*"}
        known |= owners_of(self.settings.checkpoint_root) | self._accounts
        check_distinct(user, account, known)
        self._accounts[user] = account
        return account

    def _supervisor_config(self, user: str) -> SupervisorConfig:
        return SupervisorConfig(
            node_id=self.node_id,
            run_root=self.settings.work_dir / "runs" / user,
            checkpoint_root=self.settings.checkpoint_root / user,
            gpu_indices=frozenset(self._inventory),
            term_grace_s=self.settings.term_grace_s,
            shutdown_timeout_s=self.settings.suspend_timeout_s,
            progress_interval_s=self.settings.progress_every_s,
            progress_limits=self.settings.progress_limits,
            disk_max_bytes=self.settings.job_disk_max_bytes,
            output_max_bytes=self.settings.job_output_max_bytes,
            disk_check_s=self.settings.job_disk_check_s,
            account=self._account(user),
            cgroups=(cgroups := self._cgroup_tree(user)),
            limits=self._limit_tree(user, cgroups),
            gpu_devices={i: g.device for i, g in self._inventory.items() if g.device is not None},
            gpu_processes=self._gpus.compute_processes,
            threads_per_gpu=(
                None
                if self.settings.job_threads == "off"
                else threads_per_gpu(self.settings.job_cpus_per_gpu, len(self._inventory))
            ),
        )

    def _limit_tree(self, user: str, cgroups: CgroupTree | None) -> LimitTree | None:
        """Where `user`'s jobs get their memory and CPU limits; `LimitError` (the tenant's
        supervisor does not start, and neither do its jobs) where the host cannot enforce
        the limits asked for."""
        if self._v1_hierarchies is None:  # the host's mounts, read once
            self._v1_hierarchies = v1_hierarchies()
        limits = self.settings.job_limits
        limiting = DEVICES in self._v1_hierarchies or (
            cgroups is not None and device_program.available()
        )
        if limiting and any(g.device for g in self._inventory.values()):
            # Where the host allows neither a device program on the job's v2 cgroup nor a v1
            # devices cgroup, CUDA_VISIBLE_DEVICES alone separates GPUs (docs/security.md).
            limits = dataclasses.replace(limits, devices=True)
        if not limits.controllers:
            return None
        relative = tenant_directory(self.node_id, user, self.settings.work_dir)
        return LimitTree.under(limits, cgroups, self._v1_hierarchies, relative)

    def _cgroup_tree(self, user: str) -> CgroupTree | None:
        if self._cgroup_base is None:
            return None
        try:
            return CgroupTree.under(self._cgroup_base, self.node_id, user, self.settings.work_dir)
        except CgroupError as error:
            if self.settings.job_cgroups != AUTO:
                raise
            # The host showed a hierarchy but refuses this subtree: run as if it had none.
            _log.warning("no job cgroups", node_id=self.node_id, error=str(error))
            self._cgroup_base = None
            return None

    # ----- queries -----------------------------------------------------------------------

    def runs(self) -> list[LocalJob]:
        """The latest run of every job started here, running or not."""
        return self._runs.all()

    def running(self) -> list[LocalJob]:
        return self._runs.running()

    def job(self, user: str, job_id: str) -> LocalJob | None:
        return self._runs.get(JobRef(user=user, job_id=job_id))

    # ----- start and stop ----------------------------------------------------------------

    async def start(self, runtime: ServiceRuntime) -> None:
        """Stop what an earlier executor of this node left running, then register."""
        count_from_zero(self.node_id)
        self._sink.bind(runtime)
        reaped = await self._supervisors.open_existing(self.settings.work_dir / "runs")
        inventory = [self._inventory[i] for i in sorted(self._inventory)]
        await self._sink.publish(
            NodeRegistered(
                node_id=self.node_id,
                hostname=socket.gethostname()[:255] or self.node_id,
                gpus=inventory_event(inventory),
                heartbeat_interval_s=self.settings.heartbeat_s,
                simulated=any(gpu.simulated for gpu in inventory),
                executor_version=gfair.__version__,
            )
        )
        for user, run in reaped:
            await self._announce_reaped(user, run)
        _log.info(
            "node registered",
            node_id=self.node_id,
            gpus=len(inventory),
            generations=sorted({gpu.generation for gpu in inventory}),
            reaped=len(reaped),
        )

    async def _announce_reaped(self, user: str, run: ReapedRun) -> None:
        if run.end is RunEnd.EXITED:
            # It ended on its own as the earlier executor died, unreported: the failure
            # detector classifies it as any exit (under the key that executor would have used).
            exited = JobExited(
                user=user,
                job_id=run.job_id,
                node_id=self.node_id,
                attempt=max(run.attempt, 1),
                exit_code=run.exit_code,
                signal=run.signal,
                runtime_s=run.ran_s,
                stderr_tail=run.stderr_tail[-MAX_STDERR_TAIL_CHARS:],
            )
            key = f"{self.node_id}/exit/{user}/{run.job_id}/{run.attempt}/{run.started_at!r}"
            _log.warning(
                "reported the exit of a job an earlier executor saw end",
                user=user,
                job_id=run.job_id,
                exit_code=run.exit_code,
            )
            await self._sink.publish(exited, key=key)
        elif run.end is RunEnd.STOPPED:
            # The scheduler may still think it runs here: it is off its GPUs now, with its
            # checkpoint, exactly as after a drain, so the next quantum can start it again.
            _log.warning(
                "stopped a job an earlier executor left running",
                user=user,
                job_id=run.job_id,
                found_alive=run.found_alive,
                checkpoint_step=run.checkpoint.step if run.checkpoint else None,
            )
            suspended = JobSuspended(
                user=user,
                job_id=run.job_id,
                node_id=self.node_id,
                attempt=max(run.attempt, 1),
                reason=SuspendReason.DRAIN,
                checkpoint_step=run.checkpoint.step if run.checkpoint else None,
            )
            await self._sink.publish(suspended, key=f"{self.node_id}/reaped/{run.run_dir}")
        # (A kill is reported by no one: whoever asked for it decided what follows.)
        run.told()

    async def close(self) -> None:
        """Checkpoint and stop every job (reported `suspended`, reason drain), then let go.

        Called on SIGTERM before the bus closes, so a restarted cluster resumes them.
        """
        if self._closed:
            return
        self._closed = True
        running = self._runs.alive()  # a job parked in place checkpoints too
        if running:
            _log.info("draining jobs", jobs=[str(run.job) for run in running])
        results = await asyncio.gather(
            *(self._drain(run) for run in running), return_exceptions=True
        )
        for run, result in zip(running, results, strict=True):
            if isinstance(result, BaseException):
                _log.error("drain failed", job=str(run.job), error=repr(result))
        await self._supervisors.close()
        self._gpus.close()

    async def _drain(self, run: LocalJob) -> None:
        key = f"{self.node_id}/drain/{run.job}/{run.attempt}/{run.started_at!r}"
        result = await self._control.yield_run(run, None)
        if result is not None:
            drained = run.suspended(self.node_id, SuspendReason.DRAIN, result)
            await self._sink.publish_for(run, drained, key=key)
            run.told()
            count_suspend(self.node_id, SuspendReason.DRAIN)

    # ----- commands ----------------------------------------------------------------------

    async def on_command(self, envelope: Envelope, command: Command) -> Sequence[Emit]:
        if command.node_id != self.node_id:
            raise Unprocessable(f"command for node {command.node_id} reached {self.node_id}")
        attributes: dict[str, str | int | list[int]] = {
            "gfair.user": command.user,
            "gfair.job.id": command.job_id,
            "gfair.node": self.node_id,
            "gfair.attempt": command.attempt,
        }
        if isinstance(command, StartCommand | ResumeCommand):
            attributes["gfair.gpus"] = len(command.gpu_indices)
            attributes["gfair.gpu.indices"] = list(command.gpu_indices)
            known = [i for i in command.gpu_indices if i in self._inventory]
            generations = {self._inventory[i].generation for i in known}
            if len(generations) == 1:
                attributes["gfair.generation"] = generations.pop()
        with _tracer.start_as_current_span(
            f"node_executor.{command.command_name()}", attributes=attributes
        ):
            await self._commands.handle(envelope, command)
        # Published by the command itself, in order with the relay (see the module doc).
        return []

    # ----- timers ------------------------------------------------------------------------

    async def heartbeat(self) -> Sequence[Emit]:
        seq = self._heartbeat_seq
        self._heartbeat_seq += 1
        running = tuple(run.job for run in self.running())
        heartbeat = NodeHeartbeat(
            node_id=self.node_id, seq=seq, running=running, fault=await self._fault()
        )
        return [Emit(heartbeat, traced=False)]

    async def _fault(self) -> str | None:
        """What keeps this node from running its jobs: the container engine it runs them
        through, where it runs any, not answering (the failure detector re-places them)."""
        if self._containers is None:
            return None
        if self._engine_fault is None:  # not probed yet: the first heartbeat asks
            await self.probe_engine()
            assert self._engine_fault is not None
        return self._engine_fault[0]

    async def probe_engine(self) -> Sequence[Emit]:
        """Timer (container nodes): ask the engine whether it answers, for the heartbeats."""
        from gfair.node.container_jobs import engine_fault

        assert self._containers is not None
        self._engine_fault = (await engine_fault(self._containers.engine_url),)
        return []

    async def telemetry(self) -> Sequence[Emit]:
        samples, xids = await anyio.to_thread.run_sync(self._read_gpus, self._runs.busy_gpus())
        self._xids.add(xids)
        self._record_utilization(samples)
        self._record_busy()
        gpus = telemetry_samples(samples, self._xids.take_unreported(self._inventory))
        if not gpus:
            return []
        return [Emit(NodeTelemetry(node_id=self.node_id, gpus=gpus), traced=False)]

    def _record_utilization(self, samples: Sequence[GpuReading]) -> None:
        gauge = gfair_metrics().gpu_utilization
        for sample in samples:
            gpu = self._inventory.get(sample.index)
            if sample.error is not None or sample.utilization_pct is None or gpu is None:
                continue
            attributes: dict[str, str | int] = {
                "node": self.node_id,
                "gpu": sample.index,
                "generation": gpu.generation,
            }
            gauge.set(min(max(sample.utilization_pct / 100.0, 0.0), 1.0), attributes)

    def _record_busy(self) -> None:
        """GPUs running a job's process, per generation (0 too: a gauge repeats its last)."""
        busy = dict.fromkeys(sorted({gpu.generation for gpu in self._inventory.values()}), 0)
        for index in self._runs.busy_gpus():
            gpu = self._inventory.get(index)
            if gpu is not None:
                busy[gpu.generation] += 1
        for generation, count in busy.items():
            gfair_metrics().gpus_busy.set(count, {"node": self.node_id, "generation": generation})

    def _read_gpus(self, busy: frozenset[int]) -> tuple[list[GpuReading], list[XidError]]:
        return self._gpus.sample(busy), self._gpus.poll_xid_errors()


__all__ = ["COMMANDS_IN_FLIGHT", "SERVICE_NAME", "NodeExecutor"]
