"""Jobs in their own container images (`gfair submit --image`), run through the node's Docker
engine; a job without an image runs as a process, as `JobSupervisor` runs it.

A container job is a process job in every other way: the same run and checkpoint directories,
environment (but the host's own variables), progress records, yield, park and resume through
the SDK's control files, exit settlement and log files. What differs is how it is started,
signalled, frozen and cleared (`ContainerProcess`):

- started as the tenant's uid and gid whatever the image's ``USER``, with no capabilities, no
  privileged mode, ``no-new-privileges``, a read-only root with a private ``/tmp``, and the
  node's memory, CPU and process limits per GPU (`JobLimits`);
- its control directory, checkpoint directory and working directory mounted at the paths the
  SDK's variables name; the job SDK (``gfair.sdk``, standard library only) mounted read-only
  on ``PYTHONPATH``; the host mounts the operator allows (`ContainerOptions.refusal`);
- GPUs by device request where the node has real ones (the NVIDIA runtime);
- the engine's default network, but a part of a gang across servers the host's, where its
  peers find it (``MASTER_ADDR``, ``NODE_RANK``: `gfair.events.gang_peers`);
- an init process (``docker-init``) that forwards signals to the job and reaps its orphans;
  signals go through the engine (``docker kill --signal``), freezing is ``docker pause``;
- labelled with its job, node and tenant's run root, so that a restarted node finds and
  removes what an earlier executor left (then reports those runs as `reap_orphans` does);
- its stdout and stderr copied to the run's log files, which are shipped as a process's.

An image the engine cannot find or pull fails the start with the engine's message (the job's
error, not retried elsewhere); an engine that cannot be reached says so in words the failure
classification takes for the node's fault (`CONTAINER_ENGINE_DOWN`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import aiodocker
import aiohttp
import anyio
import anyio.abc
import anyio.from_thread
from aiodocker.containers import DockerContainer

import gfair.sdk
from gfair.node.job_cgroup import JobCgroup
from gfair.node.job_limits import JobLimitGroups, JobLimits
from gfair.node.job_runner import JobStartError, SupervisorConfig
from gfair.node.launch import RunSpec
from gfair.node.run_directory import RunDirectory
from gfair.node.supervised_job import SupervisedJob
from gfair.node.supervisor import PASSED_TO_JOBS, JobSupervisor, _resident_bytes

_log = logging.getLogger("gfair.node")

# Words of a start error or a note in a job's stderr that the failure classification reads as
# the node's fault (`gfair.core.failure`): the job would run elsewhere.
CONTAINER_ENGINE_DOWN = "the container engine is unreachable"
# Where the job SDK is mounted in a job's container (a namespace package `gfair`, its `sdk`).
SDK_ROOT = "/opt/gfair"
LABEL_JOB, LABEL_NODE, LABEL_RUNS = "gfair.job", "gfair.node", "gfair.runs"
_TMP_SIZE = "1g"
# How long the copies of a job's output may trail its exit.
_LOGS_DRAIN_S = 2.0
# How long the engine may take to answer that probe (`engine_fault`).
_PROBE_S = 5.0
_FAULT_CHARS = 1000
# A container's exit status past this is 128 + the signal that ended its job.
_SIGNALLED = 128


@dataclass(frozen=True, slots=True)
class ContainerOptions:
    """How this node runs container jobs: `refusal` says why an image or mount is not allowed
    (the operator's rule, `gfair.events.container_policy`), None when it is."""

    refusal: Callable[[str, Sequence[str]], str | None]
    limits: JobLimits = field(default_factory=JobLimits)
    # Real GPUs, given to containers by device request (the NVIDIA container runtime);
    # simulated ones need none.
    gpu_requests: bool = False
    engine_url: str | None = None  # None: $DOCKER_HOST, else the local socket
    # The job SDK's directory as the engine's host sees it (`copied_sdk`); None: this
    # installation's own, where the engine runs on the executor's own host and filesystem.
    sdk: Path | None = None


class ContainerProcess(anyio.abc.Process):
    """A job's container as the supervisor sees a process: waited for, signalled, frozen."""

    def __init__(
        self, container: DockerContainer, pid: int, tasks: anyio.abc.TaskGroup, run: RunDirectory
    ) -> None:
        self.container = container
        self._pid = pid
        self._tasks = tasks
        self._run = run
        self._returncode: int | None = None
        self.logs_done = anyio.Event()

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._returncode

    async def wait(self) -> int:
        if self._returncode is not None:
            return self._returncode
        try:
            status = int((await self.container.wait(timeout=None))["StatusCode"])
            state = (await self.container.show())["State"]
        except (aiodocker.DockerError, aiohttp.ClientError) as exc:
            if not (isinstance(exc, aiodocker.DockerError) and exc.status == 404):
                self._note(f"{CONTAINER_ENGINE_DOWN} while the job ran: {exc}")
            # (404: removed by the node, `remove`.)
            self._returncode = -signal.SIGKILL
            return self._returncode
        with anyio.move_on_after(_LOGS_DRAIN_S):
            await self.logs_done.wait()
        if state.get("OOMKilled"):
            self._note("the kernel's OOM killer stopped this job: it went over its memory limit")
        signalled = status - _SIGNALLED
        self._returncode = -signalled if 0 < signalled < signal.NSIG else status
        return self._returncode

    def send_signal(self, signal: int) -> None:
        self._tasks.start_soon(self.deliver, signal)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    async def deliver(self, signum: int) -> None:
        with contextlib.suppress(aiodocker.DockerError, aiohttp.ClientError):
            await self.container.kill(signal=signal.Signals(signum).name)

    async def remove(self) -> None:
        """Kill it and everything in it, and remove it: nothing of the run survives."""
        with contextlib.suppress(aiodocker.DockerError, aiohttp.ClientError):
            await self.container.delete(force=True)

    # `Freezer`: called from worker threads (`JobSupervisor._freeze`, `_hold`).
    def freeze(self) -> bool:
        return anyio.from_thread.run(self._engine, self.container.pause)

    def thaw(self) -> bool:
        return anyio.from_thread.run(self._engine, self.container.unpause)

    async def _engine(self, call: Callable[[], Any]) -> bool:
        try:
            await call()
        except (aiodocker.DockerError, aiohttp.ClientError) as exc:
            _log.warning("container %s: %s", self.container.id[:12], exc)
            return False
        return True

    async def copy_logs(self) -> None:
        """Append what the job writes to the run's stdout and stderr logs, until it exits."""
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._copy, self._run.stdout, {"stdout": True})
                group.start_soon(self._copy, self._run.stderr, {"stderr": True})
        finally:
            self.logs_done.set()

    async def _copy(self, path: Path, which: dict[str, bool]) -> None:
        quiet = contextlib.suppress(aiodocker.DockerError, aiohttp.ClientError, OSError)
        with quiet, self._run.open_output(path) as out:
            async for line in self.container.log(follow=True, timeout=None, **which):
                out.write(line.encode())
                out.flush()

    def _note(self, text: str) -> None:
        with contextlib.suppress(OSError), self._run.open_output(self._run.stderr) as stderr:
            stderr.write(f"\ngfair: {text}\n".encode())

    async def aclose(self) -> None:
        pass

    @property
    def stdin(self) -> None:
        return None

    @property
    def stdout(self) -> None:
        return None

    @property
    def stderr(self) -> None:
        return None


class ContainerSupervisor(JobSupervisor):
    """One tenant's jobs on this node: in their images where they name one, else processes."""

    def __init__(self, config: SupervisorConfig, options: ContainerOptions) -> None:
        super().__init__(config)
        self.options = options
        self._docker: aiodocker.Docker | None = None

    async def __aenter__(self) -> Self:
        self._docker = aiodocker.Docker(url=self.options.engine_url)
        try:
            await self._remove_left_behind()
            return await super().__aenter__()
        except BaseException:
            await self._docker.close()
            raise

    async def _closing(self) -> None:
        try:
            await super()._closing()
        finally:
            if self._docker is not None:
                await self._docker.close()

    @property
    def _labels(self) -> dict[str, str]:
        return {LABEL_NODE: self.config.node_id, LABEL_RUNS: str(self.config.run_root)}

    async def _remove_left_behind(self) -> None:
        """The containers an earlier executor of this node left for this tenant: removed, so
        their runs are reported ended (`reap_orphans`) and none goes on beside a new one."""
        assert self._docker is not None
        filters = {"label": [f"{k}={v}" for k, v in self._labels.items()]}
        try:
            found = await self._docker.containers.list(all=True, filters=filters)
        except (aiodocker.DockerError, aiohttp.ClientError) as exc:
            _log.warning(
                "%s: containers left behind not looked for: %s", CONTAINER_ENGINE_DOWN, exc
            )
            return
        for container in found:
            _log.warning("removing container %s left by an earlier executor", container.id[:12])
            with contextlib.suppress(aiodocker.DockerError):
                await container.delete(force=True)

    # ----- what differs from a process ----------------------------------------------------------

    async def _launch(self, launch: RunSpec) -> SupervisedJob:
        job = await super()._launch(launch)
        if isinstance(job.process, ContainerProcess):
            job.freezer = job.process
        return job

    async def _spawn(
        self, launch: RunSpec, env: dict[str, str], workdir: Path, run: RunDirectory
    ) -> tuple[anyio.abc.Process, JobCgroup | None, JobLimitGroups | None]:
        if launch.image is None:
            return await super()._spawn(launch, env, workdir, run)
        refused = self.options.refusal(launch.image, launch.mounts)
        if refused is not None:
            raise JobStartError(f"job {launch.job_id}: {refused}")
        assert self._docker is not None and self._tasks is not None
        config = self._container_config(launch, env, workdir, run)
        try:
            await self._image(launch.image)
            container = await self._docker.containers.create(config)
            try:
                await container.start()
                pid = int((await container.show())["State"]["Pid"])
            except BaseException:
                with anyio.CancelScope(shield=True), contextlib.suppress(aiodocker.DockerError):
                    await container.delete(force=True)
                raise
        except aiodocker.DockerError as exc:
            raise JobStartError(
                f"job {launch.job_id} in image {launch.image}: {_engine_message(exc)}"
            ) from exc
        except aiohttp.ClientError as exc:
            raise JobStartError(f"job {launch.job_id}: {CONTAINER_ENGINE_DOWN}: {exc}") from exc
        process = ContainerProcess(container, pid, self._tasks, run)
        self._tasks.start_soon(process.copy_logs, name=f"gfair-logs-{launch.job_id}")
        return process, None, None

    async def _image(self, image: str) -> None:
        """The image, pulled where the engine does not have it (`DockerError` where it cannot
        be: the engine's message says why)."""
        assert self._docker is not None
        try:
            await self._docker.images.inspect(image)
        except aiodocker.DockerError as exc:
            if exc.status != 404:
                raise
            await self._docker.images.pull(image)

    def _container_config(
        self, launch: RunSpec, env: dict[str, str], workdir: Path, run: RunDirectory
    ) -> dict[str, Any]:
        checkpoint_dir = self.config.checkpoint_root / launch.job_id
        account = self.config.account
        user = (
            f"{os.geteuid()}:{os.getegid()}" if account is None else f"{account.uid}:{account.gid}"
        )
        binds = [f"{path}:{path}" for path in (run.control_dir, checkpoint_dir, workdir)] + [
            f"{self.options.sdk or Path(gfair.sdk.__file__).parent}:{SDK_ROOT}/gfair/sdk:ro",
            *launch.mounts,
        ]
        host: dict[str, Any] = {
            "Binds": binds,
            "CapDrop": ["ALL"],
            "Privileged": False,
            "SecurityOpt": ["no-new-privileges"],
            "ReadonlyRootfs": True,
            "Tmpfs": {"/tmp": f"rw,nosuid,nodev,size={_TMP_SIZE}"},
            "Init": True,
            **_resources(self.options.limits, launch.prepared_gpus or len(launch.gpu_indices)),
        }
        if int(launch.env.get("NNODES", "1") or 1) > 1:
            # A part of a gang across servers: its ranks meet at MASTER_ADDR:MASTER_PORT, a
            # host's address (`gfair.events.gang_peers`), so it runs in the host's network, as
            # a process does; any other container job in the engine's own.
            host["NetworkMode"] = "host"
        if self.options.gpu_requests and launch.gpu_indices:
            ids = launch.gpu_uuids or tuple(str(i) for i in launch.gpu_indices)
            host["DeviceRequests"] = [
                {"Driver": "nvidia", "DeviceIDs": list(ids), "Capabilities": [["gpu"]]}
            ]
        return {
            "Image": launch.image,
            "Entrypoint": [launch.argv[0]],
            "Cmd": list(launch.argv[1:]),
            "Env": [f"{k}={v}" for k, v in _container_environment(launch, env).items()],
            "User": user,
            "WorkingDir": str(launch.workdir or workdir),
            "Labels": {**self._labels, LABEL_JOB: launch.job_id},
            "HostConfig": host,
        }

    def _signal(self, job: SupervisedJob, signum: signal.Signals) -> None:
        if isinstance(job.process, ContainerProcess):
            job.process.send_signal(signum)
        else:
            super()._signal(job, signum)

    def _signal_sdk(self, job: SupervisedJob, signum: signal.Signals = signal.SIGUSR1) -> None:
        # Its SDK's pid is the container's own; the init process passes the signal on to the
        # job's first process, the one that runs the SDK.
        if not isinstance(job.process, ContainerProcess):
            super()._signal_sdk(job, signum)
        elif job.sdk_pid is not None:
            job.process.send_signal(signum)

    async def _kill_all(self, job: SupervisedJob) -> None:
        if isinstance(job.process, ContainerProcess):
            await job.process.remove()
        else:
            await super()._kill_all(job)

    async def _clear_group(self, job: SupervisedJob) -> None:
        if isinstance(job.process, ContainerProcess):
            with anyio.CancelScope(shield=True):
                await job.process.remove()
        else:
            await super()._clear_group(job)

    def _resident(self, job: SupervisedJob) -> int:
        if not isinstance(job.process, ContainerProcess):
            return super()._resident(job)
        # The init process's child: the job's first process.
        children = Path(f"/proc/{job.handle.pid}/task/{job.handle.pid}/children")
        with contextlib.suppress(OSError, ValueError, IndexError):
            return _resident_bytes(int(children.read_text().split()[0]))
        return 0


def copied_sdk(into: Path) -> Path:
    """The job SDK copied into `into`, for an engine that sees the executor's files only where
    they are on a host directory mounted at the same path (an executor in a container,
    deploy/compose.containers.yaml): its installation's own directory is in its image."""
    target = into / "gfair" / "sdk"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(
        Path(gfair.sdk.__file__).parent, target, ignore=shutil.ignore_patterns("__pycache__")
    )
    return target


def _container_environment(launch: RunSpec, env: dict[str, str]) -> dict[str, str]:
    """The job's environment without the host's own variables (the image has its own PATH,
    its own Python), with the SDK on ``PYTHONPATH`` and a ``TMPDIR`` inside the container."""
    own = {
        name: value
        for name, value in env.items()
        if name in launch.env or not (name in PASSED_TO_JOBS or name.startswith("LC_"))
    }
    extra = launch.env.get("PYTHONPATH")
    own["PYTHONPATH"] = SDK_ROOT if not extra else f"{SDK_ROOT}:{extra}"
    own["TMPDIR"] = "/tmp"
    if "HOME" in env:
        own["HOME"] = env["HOME"]
    return own


def _resources(limits: JobLimits, gpus: int) -> dict[str, int]:
    """The engine's resource settings for a job on `gpus` GPUs (the node's per-GPU limits)."""
    share = max(gpus, 1)
    out: dict[str, int] = {}
    if limits.memory_per_gpu is not None:
        out["Memory"] = out["MemorySwap"] = limits.memory_per_gpu * share
    if limits.cpus_per_gpu is not None:
        out["NanoCpus"] = int(limits.cpus_per_gpu * share * 1e9)
    if limits.pids_max is not None:
        out["PidsLimit"] = limits.pids_max
    return out


async def engine_fault(url: str | None, timeout_s: float = _PROBE_S) -> str | None:
    """Why this node's container engine cannot run jobs (it does not answer), or None: the
    node's fault (`NodeHeartbeat.fault`) while the operator has it run container jobs."""
    try:
        with anyio.fail_after(timeout_s):
            async with aiodocker.Docker(url=url) as docker:
                await docker.version()
    except (aiodocker.DockerError, aiohttp.ClientError, OSError, ValueError, TimeoutError) as exc:
        return f"{CONTAINER_ENGINE_DOWN}: {exc or type(exc).__name__}"[:_FAULT_CHARS]
    return None


def _engine_message(error: aiodocker.DockerError) -> str:
    if error.status == 900:  # aiodocker's: no connection
        return f"{CONTAINER_ENGINE_DOWN}: {error.message}"
    return f"the container engine refused it: {error.message}"
