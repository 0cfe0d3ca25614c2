"""Runs jobs as OS processes on this node's GPUs; suspends them through checkpoints.

Each job runs in its own session and process group with CUDA_VISIBLE_DEVICES set to its GPUs,
its logs in a per-run directory and its checkpoints in `<checkpoint_root>/<job_id>/`, a directory
every executor that may resume the job can read. Suspend asks the job to checkpoint at its next
mini-batch boundary (a yield file, plus SIGUSR1 once the SDK said it handles it), waits, then
escalates SIGTERM -> SIGKILL on the whole group and falls back to the previous checkpoint.
Resume and migrate are a new `start` from the checkpoint directory. A job may also wait in
place: parked by its SDK, or frozen in its cgroup while it comes up. The lifecycle and what is
reported of it are `JobRunner`'s (`job_runner`); this is how a process is started, signalled,
frozen and watched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal, Self

import anyio
import anyio.abc
import anyio.to_thread

from gfair.node.job_account import JobAccount
from gfair.node.job_cgroup import JobCgroup, empty
from gfair.node.job_disk import cap_outputs, disk_overrun
from gfair.node.job_files import NotOwnFile, own_checkpoint
from gfair.node.job_limits import JobLimitGroups, LimitError, device_rules
from gfair.node.job_runner import JobRunner, JobStartError, SupervisorConfig, SupervisorError
from gfair.node.job_sandbox import spawn
from gfair.node.job_threads import THREADS_VARIABLE, job_threads
from gfair.node.launch import CheckpointRef, JobPaths, RunningJob, RunSpec
from gfair.node.lifecycle import (
    Escalation,
    JobEvent,
    ParkedJob,
    SuspendResult,
)
from gfair.node.orphans import reap_orphans
from gfair.node.process_group import (
    any_running_as,
    collect,
    enable_subreaper,
    group_exists,
    in_group,
    marked,
    read_tail,
    reap_zombie_members,
    reap_zombies_in,
    signal_group,
)
from gfair.node.progress import ProgressTail, RateWindow
from gfair.node.run_directory import PASSAGE_MODE, RunDirectory
from gfair.node.supervised_job import SupervisedJob
from gfair.node.tenant_paths import made, make_job_directory, owners, remove_in, remove_owned
from gfair.sdk.checkpoint import Checkpoint, CheckpointError, CheckpointStore, read_checkpoint
from gfair.sdk.environment import ENV_CONTROL_DIR, PARKED_MARKER, JobEnvironment
from gfair.sdk.parking import ANSWER_SIGNAL
from gfair.sdk.progress import ProgressRecord

_log = logging.getLogger("gfair.node")

# How often a job's records are read while someone waits on them (a suspend, a resume).
_EAGER_POLL_S = 0.005
# How often a running job's output files are cut back to their cap.
_OUTPUT_CAP_S = 0.5
# How often the zombies of jobs' orphans are collected: a job can leave one per process it may
# have (`GFAIR_JOB_PIDS_MAX`) each such while.
_ZOMBIE_SWEEP_S = 1.0
# A tenant's run root: root's, passable by the tenant's group only.
_TENANT_PASSAGE_MODE = 0o710
# How long to wait for SIGKILLed stragglers of an exited job to disappear.
_CLEAR_GROUP_S = 2.0


# What of the host's environment a job may see (see `host_environment`).
PASSED_TO_JOBS = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TERM",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "LD_LIBRARY_PATH",
        "CUDA_HOME",
        "CUDA_PATH",
        "NCCL_SOCKET_IFNAME",
        "NCCL_IB_DISABLE",
        "NVIDIA_DRIVER_CAPABILITIES",
    }
)


def host_environment(host: Mapping[str, str]) -> dict[str, str]:
    """The host variables a job's process inherits: `PASSED_TO_JOBS` and the locale's `LC_*`.

    An allowlist, not a denylist: the executor's environment holds its NATS URL and
    credentials and every service setting, and a job runs someone else's code.
    """
    return {
        name: value
        for name, value in host.items()
        if name in PASSED_TO_JOBS or name.startswith("LC_")
    }


class JobSupervisor(JobRunner[SupervisedJob]):
    def __init__(self, config: SupervisorConfig) -> None:
        super().__init__(config)
        # How /proc names its jobs' cgroups, where their orphans' zombies are collected.
        self._zombies_in: str | None = None

    async def __aenter__(self) -> Self:
        if self.config.account is None and os.geteuid() == 0:
            raise SupervisorError(
                "jobs never run as root: a supervisor running as root needs the account its "
                "jobs run as (SupervisorConfig.account; the node executor derives one per tenant)"
            )
        run_root, checkpoint_root = self.config.run_root, self.config.checkpoint_root
        run_root.parent.mkdir(parents=True, exist_ok=True)
        with made(run_root.parent, run_root.name, mode=PASSAGE_MODE) as fd:
            if self.config.account is not None:
                # Only this tenant's jobs pass (by group): another's gets EACCES for any name
                # below, whether it exists or not, so it cannot tell which job ids run here.
                os.fchown(fd, -1, self.config.account.gid)
                os.fchmod(fd, _TENANT_PASSAGE_MODE)
        checkpoint_root.parent.mkdir(parents=True, exist_ok=True)
        # The account's checkpoints, closed to every other tenant's.
        make_job_directory(checkpoint_root.parent, checkpoint_root.name, self.config.account)
        if self.config.reap_descendants:
            enable_subreaper()
        self.reaped = await reap_orphans(
            self.config.run_root,
            node_id=self.config.node_id,
            checkpoint_root=self.config.checkpoint_root,
            grace_s=self.config.term_grace_s,
            tail_bytes=self.config.stderr_tail_bytes,
        )
        if self.config.cgroups is not None:
            # Whatever an earlier executor's jobs left once they were stopped (escapees).
            await anyio.to_thread.run_sync(self.config.cgroups.sweep)
        if self.config.limits is not None:
            await anyio.to_thread.run_sync(self.config.limits.sweep)
        await super().__aenter__()
        cgroups = self.config.cgroups
        shown = cgroups.shown_as() if cgroups is not None and self.config.reap_descendants else None
        self._zombies_in = shown
        if shown is not None:
            assert self._tasks is not None
            self._tasks.start_soon(self._reap_zombies, shown, name="gfair-zombies")
        return self

    async def _reap_zombies(self, cgroup: str) -> None:
        """Collect the zombies of jobs' orphans as they come (`reap_zombies_in`), sparing the
        leaders the event loop waits for."""
        while True:
            await anyio.sleep(_ZOMBIE_SWEEP_S)
            leaders = {job.handle.pid for job in self._jobs.values()}
            await anyio.to_thread.run_sync(reap_zombies_in, cgroup, leaders)

    async def _closing(self) -> None:
        if self._zombies_in is not None:
            # The orphans of the jobs just stopped: no later sweep would see them.
            await anyio.to_thread.run_sync(reap_zombies_in, self._zombies_in, set())
        if self.config.cgroups is not None:
            self.config.cgroups.close()
        if self.config.limits is not None:
            self.config.limits.close()

    # ----- queries -------------------------------------------------------------------------

    def parked(self) -> list[ParkedJob]:
        """Jobs parked or frozen in place, longest first, with their host memory (RSS)."""
        found = [
            ParkedJob(
                job.handle.job_id,
                job.handle.gpu_indices,
                since,
                self._resident(job),
            )
            for job in self._jobs.values()
            if (since := job.in_place_since) is not None and not job.terminating
        ]
        return sorted(found, key=lambda p: p.since)

    def _resident(self, job: SupervisedJob) -> int:
        return _resident_bytes(job.sdk_pid or job.handle.pid)

    # ----- commands ------------------------------------------------------------------------

    async def _launch(self, launch: RunSpec) -> SupervisedJob:
        """Start the job's process (fresh, resumed or migrated here)."""
        if self.config.visible_devices == "uuid" and not launch.gpu_uuids and launch.gpu_indices:
            raise SupervisorError(f"job {launch.job_id}: gpu_uuids are required")
        checkpoint_dir = self.config.checkpoint_root / launch.job_id
        account = self.config.account
        try:
            # The tenant's own directory holds it, where a job may have left a link in its place.
            await anyio.to_thread.run_sync(
                make_job_directory, self.config.checkpoint_root, launch.job_id, account
            )
        except NotOwnFile as exc:
            raise JobStartError(f"job {launch.job_id}: checkpoint directory: {exc}") from exc
        # The checkpoint root may be a network filesystem: keep its reads off the event loop.
        resume = await anyio.to_thread.run_sync(self._verified_resume, launch, checkpoint_dir)

        # A container's working directory is its image's business (`container_jobs`).
        own = launch.workdir if launch.image is None else None
        if own is not None and account is not None:
            # Made (where missing) and checked by the account itself, never by root: a job
            # may work only where its account may write (not /etc, not another tenant's).
            await _prepare_workdir(launch.job_id, own, account)
        workdir = own or self.config.run_root / launch.job_id / "work"
        try:
            run = RunDirectory.create(self.config.run_root, launch.job_id, account)
            if own is None:
                make_job_directory(workdir.parent, workdir.name, account)
        except NotOwnFile as exc:
            raise JobStartError(f"job {launch.job_id}: run directory: {exc}") from exc
        if own is not None and account is None:  # (else the account made it)
            workdir.mkdir(parents=True, exist_ok=True)
        env = self._environment(launch, run, checkpoint_dir)
        if account is not None:
            env["HOME"] = str(workdir)  # the executor's home is not the job's
        spawning = time.time()
        try:
            process, cgroup, limits = await self._spawn(launch, env, workdir, run)
        except JobStartError as exc:
            run.write_exit({"start_error": str(exc)})
            raise
        started_at = time.time()
        handle = RunningJob(
            job_id=launch.job_id,
            attempt=launch.attempt,
            pid=process.pid,
            pgid=process.pid,  # start_new_session makes it the leader of a new group
            gpu_indices=launch.gpu_indices,
            generation=launch.generation,
            started_at=started_at,
            paths=JobPaths(
                run_dir=run.path,
                workdir=workdir,
                control_dir=run.control_dir,
                stdout=run.stdout,
                stderr=run.stderr,
                checkpoint_dir=checkpoint_dir,
            ),
        )
        run.write_launch(
            {
                "node_id": self.config.node_id,
                "job_id": launch.job_id,
                "attempt": launch.attempt,
                "pid": process.pid,
                "pgid": process.pid,
                "argv": list(launch.argv),
                "gpu_indices": list(launch.gpu_indices),
                "generation": launch.generation,
                "started_at": started_at,
                # What starting it took (a container's creation, its image's inspection).
                "spawn_s": started_at - spawning,
                "resume_from": str(resume.path) if resume else None,
            }
        )
        job = SupervisedJob(
            launch=launch,
            handle=handle,
            process=process,
            run=run,
            store=CheckpointStore(checkpoint_dir),
            started_monotonic=time.monotonic(),
            tail=ProgressTail(
                run.progress_file,
                None if account is None else account.uid,
                self.config.progress_limits,
            ),
            rates=RateWindow(self.config.rate_window_s),
            steps=resume.step if resume else 0,
            progress_emitted_steps=resume.step if resume else 0,
            checkpoint=resume,
            cgroup=cgroup,
            freezer=cgroup,
            limits=limits,
            owner=None if account is None else account.uid,
        )
        return job

    async def _spawn(
        self, launch: RunSpec, env: dict[str, str], workdir: Path, run: RunDirectory
    ) -> tuple[anyio.abc.Process, JobCgroup | None, JobLimitGroups | None]:
        """Start the job's process in its cgroup and limits; `JobStartError` where it cannot."""
        if launch.image is not None:
            raise JobStartError(
                f"job {launch.job_id}: this node runs no job in a container image "
                "(its operator allows none: job_images)"
            )
        tree = self.config.cgroups
        cgroup = None if tree is None else await anyio.to_thread.run_sync(tree.job, launch.job_id)
        limits: JobLimitGroups | None = None
        try:
            if self.config.limits is not None:
                gpus = launch.prepared_gpus or len(launch.gpu_indices)
                rules = self._device_rules(launch.gpu_indices)
                limits = self.config.limits.job(launch.job_id, gpus, cgroup, rules)
            with run.open_output(run.stdout) as stdout, run.open_output(run.stderr) as stderr:
                process = await spawn(
                    launch.argv,
                    env,
                    workdir,
                    run.path,
                    cgroup=cgroup,
                    limits=limits,
                    account=self.config.account,
                    stdout=stdout,
                    stderr=stderr,
                )
        except (OSError, LimitError) as exc:
            if cgroup is not None:
                cgroup.remove()
            if limits is not None:
                limits.remove()
            raise JobStartError(
                f"job {launch.job_id}: cannot start {launch.argv[0]!r}: {exc}"
            ) from exc
        return process, cgroup, limits

    async def _suspend(
        self, job: SupervisedJob, timeout_s: float, *, enforce: bool, park: bool
    ) -> SuspendResult:
        """With `park` the job may instead yield in place (the SDK's `Job.suspend`): it moves its
        state to host memory, frees its GPUs and waits; the result then says `parked`, and
        `resume_in_place` continues it. A job already parked is told to checkpoint and exit.

        Forcing is SIGTERM, then SIGKILL after the term grace: a job may still checkpoint on
        SIGTERM (a drain at shutdown). With `enforce` (a yield the scheduler is owed: another
        job waits for these GPUs) forcing is SIGKILL at once, to everything the job started:
        a job that ignored its yield request gets no further grace, and a frozen one would
        still hold its GPUs' memory."""
        job_id = job.handle.job_id
        if job.frozen_since is not None:
            return await self._let_go_frozen(job)
        if park and (took := await self._freeze(job)) is not None:
            return SuspendResult(job_id, job.checkpoint, False, None, took, None, parked=True)
        requested_at, requested_wall = time.monotonic(), time.time()
        # Read before asking, or a quick job's fresh checkpoint would count as the old one.
        before = await anyio.to_thread.run_sync(job.store.latest)
        if job.parked is not None:
            job.yield_requested = True  # its exit is the yield it was asked for
            await self._answer(job, job.parked, "exit")
            park = False
        else:
            self._request_yield(job, park=park)
        escalation: Escalation | None = None
        job.eager = True
        with anyio.move_on_after(timeout_s):
            await _until(job, lambda: job.exited.is_set() or (park and job.parked is not None))
        job.eager = False
        if park and job.parked is not None and not job.exited.is_set() and not job.broke_park:
            assert job.parked_at is not None
            return SuspendResult(
                job_id=job_id,
                checkpoint=job.checkpoint,
                fresh=False,
                escalation=None,
                # By the job's clock: the supervisor reads its records only every so often.
                switch_s=max(0.0, min(job.parked_at - requested_wall, timeout_s)),
                exited=None,
                parked=True,
            )
        if job.broke_park is not None:
            await self._terminate(job, job.broke_park, forced_yield=True, term_grace_s=0.0)
            escalation = job.terminated_by  # its yield is forced, however soon it died
        return await self._force_off(
            job,
            timeout_s,
            enforce=enforce,
            before_seq=None if before is None else before.seq,
            requested_at=requested_at,
            escalation=escalation,
        )

    def coming_up(self, job_id: str) -> bool:
        """Whether the job's process has neither ended a mini-batch nor parked yet."""
        job = self._jobs.get(job_id)
        return job is not None and job.run_first_step_at is None and job.parked is None

    async def until_parked(
        self, job_id: str, timeout_s: float
    ) -> Literal["parked", "exited", "timeout"]:
        """Wait for a prepared start to park in `Job.from_env()` (or to end first)."""
        job = self._jobs.get(job_id)
        if job is None:
            return "exited"
        with anyio.move_on_after(timeout_s):
            await _until(job, lambda: job.exited.is_set() or job.parked is not None)
        if job.exited.is_set() or job.terminating:
            return "exited"
        return "parked" if job.parked is not None else "timeout"

    async def resume_in_place(
        self,
        job_id: str,
        timeout_s: float,
        gpu_indices: tuple[int, ...] | None = None,
        gpu_uuids: tuple[str, ...] = (),
    ) -> float | None:
        """Continue a job parked in place, in the same process; the seconds from now to its
        first mini-batch after the resume (or to its saying it resumed, if it took no further
        step), or None when it cannot resume in place: it is not parked here, it did not
        resume within `timeout_s`, or a newer checkpoint than its state exists (it ran
        elsewhere meanwhile: its state is stale). The caller then stops it (`suspend`/`kill`)
        and starts it anew from its checkpoint."""
        job = self._jobs.get(job_id)
        if job is None or job.exited.is_set() or job.terminating:
            return None
        if job.frozen_since is not None:
            return await self._thaw(job, gpu_indices)
        if job.parked is None:
            return None
        latest = await anyio.to_thread.run_sync(job.own_latest)
        if latest is not None and (job.checkpoint is None or latest.seq > job.checkpoint.seq):
            # Stale: its checkpoint, were it to write one, would bury the newer state.
            await self._terminate(
                job,
                "parked with state older than its checkpoints",
                forced_yield=True,
                term_grace_s=0.0,
            )
            return None
        requested_wall = time.time()
        granted: dict[str, str] | None = None
        if job.launch.prepared_gpus is not None and not job.handle.gpu_indices:
            # A prepared start: it holds no GPU yet; these are the ones it is given.
            if not gpu_indices:
                return None
            uuid = self.config.visible_devices == "uuid"
            if uuid and len(gpu_uuids) != len(gpu_indices):
                return None
            granted = {"CUDA_VISIBLE_DEVICES": _visible(gpu_uuids if uuid else gpu_indices)}
        if gpu_indices is not None:
            # Only where nothing binds the process to its devices (simulated GPUs: the caller
            # decides); a real one keeps the CUDA_VISIBLE_DEVICES it started with.
            await self._give(job, gpu_indices)
        job.yield_requested = False
        job.resumed_at = job.first_step_at = None
        await anyio.to_thread.run_sync(job.run.withdraw_yield)
        if not await self._answer(job, job.parked, "resume", granted):
            return None
        job.eager = True
        with anyio.move_on_after(timeout_s):
            await _until(
                job,
                lambda: (
                    job.exited.is_set()
                    or job.first_step_at is not None
                    or (job.resumed_at is not None and job.completed)
                ),
            )
        job.eager = False
        resumed = job.first_step_at if job.first_step_at is not None else job.resumed_at
        if resumed is None:
            return None
        return max(0.0, resumed - requested_wall)

    def told(self, job: RunningJob) -> None:
        try:
            RunDirectory(job.paths.run_dir).mark_told()
        except OSError as exc:
            # Its directory went (an operator's clean-up): at worst a restart reports its end
            # again, which every reader takes as said already.
            _log.warning("run of %s not marked told: %s", job.job_id, exc)

    # ----- internals -----------------------------------------------------------------------

    def _verified_resume(self, launch: RunSpec, checkpoint_dir: Path) -> CheckpointRef | None:
        ref = launch.resume_from
        owner = None if self.config.account is None else self.config.account.uid
        if ref is None:
            for latest in CheckpointStore(checkpoint_dir).checkpoints():
                if own_checkpoint(latest.path, checkpoint_dir, owner) is None:
                    return CheckpointRef.of(latest)
            return None
        try:
            checkpoint = read_checkpoint(ref.path)
        except CheckpointError as exc:
            raise JobStartError(
                f"job {launch.job_id}: checkpoint to resume from is not usable here: {exc}"
            ) from exc
        why = own_checkpoint(ref.path, checkpoint_dir, owner)
        if why is not None:
            raise JobStartError(
                f"job {launch.job_id}: checkpoint to resume from is not usable here: it is not "
                f"the job's own: {why}"
            )
        if checkpoint.seq != ref.seq:
            raise JobStartError(f"job {launch.job_id}: {ref.path} is not checkpoint {ref.seq}")
        return CheckpointRef.of(checkpoint)

    def _device_rules(self, gpu_indices: Sequence[int]) -> list[str]:
        nodes = self.config.gpu_devices or {}
        return device_rules(nodes[i] for i in gpu_indices if i in nodes)

    async def _give(self, job: SupervisedJob, gpu_indices: tuple[int, ...]) -> None:
        """`job` holds `gpu_indices` from now on: the device nodes it may open too."""
        job.handle = dataclasses.replace(job.handle, gpu_indices=gpu_indices)
        if job.limits is not None:
            rules = self._device_rules(gpu_indices)
            await anyio.to_thread.run_sync(job.limits.allow_devices, rules)

    def _environment(
        self,
        launch: RunSpec,
        run: RunDirectory,
        checkpoint_dir: Path,
    ) -> dict[str, str]:
        env: dict[str, str] = (
            host_environment(os.environ) if self.config.inherit_env else {"PATH": os.defpath}
        )
        env.setdefault("PYTHONUNBUFFERED", "1")  # so the stderr tail is current at exit
        if self.config.threads_per_gpu is not None:
            # Before the job's own variables: a job that sets it keeps its own.
            gpus = launch.prepared_gpus or len(launch.gpu_indices)
            env[THREADS_VARIABLE] = str(job_threads(self.config.threads_per_gpu, gpus))
        env.update(launch.env)
        devices = launch.gpu_uuids if self.config.visible_devices == "uuid" else launch.gpu_indices
        # Empty for a prepared start: no device is visible until it is given some.
        env["CUDA_VISIBLE_DEVICES"] = _visible(devices)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        # Set last: a job's own env must not redirect gfair's files.
        env.update(
            JobEnvironment(
                job_id=launch.job_id,
                attempt=launch.attempt,
                checkpoint_dir=checkpoint_dir,
                control_dir=run.control_dir,
                gpu_generation=launch.generation,
                resume_checkpoint=launch.resume_from.path if launch.resume_from else None,
                managed=True,
                prepared=launch.prepared_gpus is not None,
            ).to_environ()
        )
        return env

    async def _freeze(self, job: SupervisedJob) -> float | None:
        """Freeze a job still coming up (no mini-batch yet, not parked) where it is, when
        nothing of it holds GPU memory; the seconds it took, or None (it is not frozen).

        Its start-up (imports, a checkpoint's load) then goes on where it stopped at its next
        slice here, instead of beginning again at every slice: one longer than a slice would
        never end. It has nothing to yield with yet, and a frozen process holds no GPU, so
        its GPUs are free at once; what it holds of the host counts as a parked job's does.
        Only where the job has a cgroup (no process of it can leave or undo the freeze) and
        the GPUs can say that no process holds memory on its own; that is asked once it is
        frozen, when nothing of it can make a context any more."""
        probe = self.config.gpu_processes
        cgroup = job.freezer
        if cgroup is None or probe is None or job.exited.is_set() or job.terminating:
            return None
        if not self.coming_up(job.handle.job_id):
            return None
        began = time.monotonic()
        if not await anyio.to_thread.run_sync(cgroup.freeze):
            await anyio.to_thread.run_sync(cgroup.thaw)
            return None
        if await anyio.to_thread.run_sync(probe, job.handle.gpu_indices) != 0:
            await anyio.to_thread.run_sync(cgroup.thaw)
            return None
        job.frozen_since = time.monotonic()
        return job.frozen_since - began

    async def _thaw(self, job: SupervisedJob, gpu_indices: tuple[int, ...] | None) -> float | None:
        """Let a frozen job go on coming up (`resume_in_place`); None when it cannot: a newer
        checkpoint than it started from was written meanwhile (it ran elsewhere), or the
        kernel did not thaw it. The caller then stops it and starts it anew."""
        assert job.freezer is not None
        latest = await anyio.to_thread.run_sync(job.own_latest)
        stale = latest is not None and (job.checkpoint is None or latest.seq > job.checkpoint.seq)
        began = time.monotonic()
        if stale or not await anyio.to_thread.run_sync(job.freezer.thaw):
            await self._terminate(job, "frozen while newer state was written", forced_yield=True)
            return None
        job.frozen_since = None
        if gpu_indices is not None:
            await self._give(job, gpu_indices)
        return time.monotonic() - began

    async def _let_go_frozen(self, job: SupervisedJob) -> SuspendResult:
        """Asked to stop a job frozen while it came up: it has nothing to save, it goes."""
        began = time.monotonic()
        job.yield_requested = True  # its end is the stop it was asked for
        escalation = await self._terminate(
            job, "let go while frozen in its start-up", forced_yield=True
        )
        assert job.exit is not None
        return SuspendResult(
            job_id=job.handle.job_id,
            checkpoint=job.exit.checkpoint,
            fresh=False,
            escalation=escalation,
            switch_s=time.monotonic() - began,
            exited=job.exit,
        )

    def _request_yield(self, job: SupervisedJob, *, park: bool = False) -> None:
        if job.yield_requested or job.exited.is_set():
            return
        job.yield_requested = True
        job.run.request_yield(park=park)
        self._signal_sdk(job)

    async def _hold(self, job: SupervisedJob) -> list[JobEvent]:
        """Check a job's word that it parked: its cgroup is frozen until the node answers, so
        one that said so and went on computing cannot, and what it wrote before the freeze must
        be nothing (`SupervisedJob.absorb`); one whose cgroup will not freeze is not believed.
        Without a cgroup only its records are checked. The events of the records read."""
        cgroup = job.freezer
        if cgroup is None or job.parked is None or job.answered or job.held:
            return []
        async with job.park_lock:
            if job.parked is None or job.answered or job.held or job.terminating:
                return []
            if not await anyio.to_thread.run_sync(cgroup.freeze):
                job.broke_park = job.broke_park or "its cgroup would not freeze when it parked"
                return []
            job.held = True
        return job.absorb(job.tail.read())

    async def _drop_liar(self, job: SupervisedJob) -> None:
        assert job.broke_park is not None
        await self._terminate(job, job.broke_park, forced_yield=True, term_grace_s=0.0)

    async def _answer(
        self, job: SupervisedJob, park: int, action: str, env: Mapping[str, str] | None = None
    ) -> bool:
        """Answer a parked job: thawed (`_hold`), then the file, then the signal that wakes it;
        False when it could not be thawed (it is killed, its yield forced)."""
        async with job.park_lock:
            if job.held and job.freezer is not None:
                job.held = not await anyio.to_thread.run_sync(job.freezer.thaw)
            job.answered = not job.held
        if job.held:
            await self._terminate(
                job, "its cgroup would not thaw", forced_yield=True, term_grace_s=0.0
            )
            return False
        job.run.answer_park(park, action, env)
        self._signal_sdk(job, ANSWER_SIGNAL)
        return True

    def _signal_sdk(self, job: SupervisedJob, signum: signal.Signals = signal.SIGUSR1) -> None:
        # Only to the process whose SDK installed a handler: the default action of SIGUSR1 and
        # SIGUSR2 is to terminate, so signalling the whole group would kill data-loader workers
        # and wrappers.
        pid = job.sdk_pid
        if pid is not None and in_group(pid, job.handle.pgid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def _signal(self, job: SupervisedJob, signum: signal.Signals) -> None:
        signal_group(job.handle.pgid, signum)

    async def _kill_all(self, job: SupervisedJob) -> None:
        """SIGKILL to the whole job now (what `_clear_group` does not find goes then)."""
        signal_group(job.handle.pgid, signal.SIGKILL)

    async def _watch(self, job: SupervisedJob) -> None:
        returncode: int | None = None
        events: list[JobEvent] = []
        try:
            try:
                async with anyio.create_task_group() as group:
                    group.start_soon(self._follow_progress, job)
                    if self.config.output_max_bytes or self.config.disk_max_bytes:
                        group.start_soon(self._watch_disk, job)
                    returncode = await job.process.wait()
                    group.cancel_scope.cancel()
            finally:
                # Shielded so a cancelled supervisor still reaps the group and records the exit.
                with anyio.CancelScope(shield=True):
                    if returncode is None:
                        await self._kill_all(job)
                        returncode = await job.process.wait()
                    # Counted before the job's cgroups go with what is left of it.
                    oom_kills = job.limits.oom_kills() if job.limits is not None else 0
                    await self._clear_group(job)
                    await self._clear_shared_tmp(job)
                    if job.limits is not None:
                        job.limits.remove()
                    if oom_kills:
                        _note_oom_kills(job, oom_kills)
                    if self.config.output_max_bytes is not None:
                        # What it wrote since the last cut, before its exit reads the tail.
                        cap_outputs(job.handle.paths.run_dir, self.config.output_max_bytes)
                    latest = await anyio.to_thread.run_sync(job.own_latest)
                    # A parked process killed before it checkpointed leaves its marker; gone
                    # now, so a start elsewhere waits for nothing (never through a link the
                    # job left in its directory's place: another job's marker).
                    allowed = owners(self.config.account)
                    with contextlib.suppress(OSError):
                        remove_in(job.handle.paths.checkpoint_dir, PARKED_MARKER, allowed)
                    events = self._finish(job, returncode, latest)
            # Outside the shield: a consumer that stopped reading must not block a shutdown.
            for event in events:
                await self._deliver(event)
        finally:
            # Waiters (suspend, kill, wait) wake after the exit's events are in the stream.
            job.exited.set()
            _notify(job)

    async def _clear_shared_tmp(self, job: SupervisedJob) -> None:
        """What the account left in the node's shared temporary directories, once it has no
        process left here: files there are held by no cgroup and would outlive every job (its
        ``TMPDIR`` and ``/dev/shm`` are its own, `job_sandbox`; ``/tmp`` is not replaced, since
        paths under it are handed to jobs)."""
        account = self.config.account
        if account is None or any(j is not job for j in self._jobs.values()):
            return
        # Another node's executor on this host (virtual nodes) may run the account's jobs too.
        if await anyio.to_thread.run_sync(any_running_as, account.uid):
            return
        for directory in self.config.shared_tmp:
            await anyio.to_thread.run_sync(remove_owned, directory, account.uid)

    async def _clear_group(self, job: SupervisedJob) -> None:
        """The leader is gone; anything left in its group (workers, daemons) goes with it, and
        so does any process of the run that left the group (`setsid`): everything in its
        cgroup, where it has one, else what carries the run's marker. A job cannot outlive its
        cancel or its suspend."""
        pgid, control_dir = job.handle.pgid, str(job.run.control_dir)
        if job.cgroup is not None:
            await anyio.to_thread.run_sync(empty, job.cgroup, _CLEAR_GROUP_S)
        if job.limits is not None:
            # Its v1 cgroups hold every process of it too (one that cleared its environment).
            await anyio.to_thread.run_sync(job.limits.kill, _CLEAR_GROUP_S)
        signal_group(pgid, signal.SIGKILL)
        escaped: set[int] = set()
        with anyio.move_on_after(_CLEAR_GROUP_S):
            while True:
                # A zombie's environment cannot be read: remember whom to wait for.
                for member in marked(ENV_CONTROL_DIR, control_dir):
                    escaped.add(member.pid)
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(member.pid, signal.SIGKILL)
                collect(escaped)  # as subreaper, orphans are ours to collect
                if not escaped and not group_exists(pgid):
                    break
                reap_zombie_members(pgid)
                await anyio.sleep(0.01)

    async def _watch_disk(self, job: SupervisedJob) -> None:
        """Keep what the job writes on the node's disk, which is every tenant's, within its
        caps: its output files cut back to theirs every `_OUTPUT_CAP_S` (a job writes hundreds
        of MB a second), and the job killed once its whole run directory goes over
        `SupervisorConfig.disk_max_bytes` (measured every `disk_check_s`)."""
        job_dir, run_dir = job.handle.paths.run_dir.parent, job.handle.paths.run_dir
        output_cap, cap = self.config.output_max_bytes, self.config.disk_max_bytes
        measured = time.monotonic()
        while True:
            await anyio.sleep(_OUTPUT_CAP_S)
            if output_cap is not None:
                await anyio.to_thread.run_sync(cap_outputs, run_dir, output_cap)
            if cap is None or time.monotonic() - measured < self.config.disk_check_s:
                continue
            measured = time.monotonic()
            over = await anyio.to_thread.run_sync(disk_overrun, job_dir, cap)
            if over is not None:
                note = f"\ngfair: this job {over} (GFAIR_JOB_DISK_MAX_BYTES): killed\n"
                with contextlib.suppress(OSError), job.run.open_output(job.run.stderr) as err:
                    err.write(note.encode())
                _log.warning("job %s killed: it %s", job.handle.job_id, over)
                await self._kill_all(job)
                return

    async def _follow_progress(self, job: SupervisedJob) -> None:
        while True:
            try:
                await self._absorb(job, await anyio.to_thread.run_sync(job.tail.read))
                if job.parked is None and not job.eager:
                    await anyio.to_thread.run_sync(job.tail.shrink)
            except Exception:
                # Whatever the job's records make fail, its watcher goes on to report its exit.
                _log.exception("job %s: its progress is no longer read", job.handle.job_id)
                return
            # A suspend or an in-place resume waits on the job's word: the switch's latency
            # is the point of parking, so its records are read at once, not every 0.1 s.
            await anyio.sleep(_EAGER_POLL_S if job.eager else self.config.poll_interval_s)

    async def _absorb(self, job: SupervisedJob, records: list[ProgressRecord]) -> None:
        had_handler = job.sdk_pid is not None
        events = job.absorb(records)
        events += await self._hold(job)
        for event in events:
            await self._deliver(event)
        if job.broke_park is not None and not job.terminating:
            assert self._tasks is not None
            self._tasks.start_soon(self._drop_liar, job)
        if records:
            _notify(job)
        if job.yield_requested and not had_handler and job.sdk_pid is not None:
            self._signal_sdk(job)  # asked before the SDK's handler existed
        progress = job.progress_due(self.config.progress_interval_s)
        if progress is not None:
            self._emit_progress(progress)

    def _finish(
        self, job: SupervisedJob, returncode: int, latest: Checkpoint | None
    ) -> list[JobEvent]:
        """Settle the exit and free the GPUs; return the events to deliver."""
        events = job.finish(
            returncode, latest, read_tail(job.run.stderr, self.config.stderr_tail_bytes)
        )
        self._exited(job)
        return events


def _visible(devices: tuple[int, ...] | tuple[str, ...]) -> str:
    """CUDA_VISIBLE_DEVICES for these GPUs (indices or UUIDs)."""
    return ",".join(str(d) for d in devices)


def _notify(job: SupervisedJob) -> None:
    news, job.news = job.news, anyio.Event()
    news.set()


async def _until(job: SupervisedJob, done: Callable[[], bool]) -> None:
    while not done():
        await job.news.wait()


def _resident_bytes(pid: int) -> int:
    """The process's resident memory (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _note_oom_kills(job: SupervisedJob, kills: int) -> None:
    """Say in the job's stderr (its owner reads it; its tail goes with the exit) that the kernel
    killed it for its memory limit: a SIGKILL nobody asked for otherwise reads as the node's
    doing (`gfair.core.failure`), and the job would be retried on another node in vain."""
    assert job.limits is not None
    limit = job.limits.memory
    size = f"{limit / (1 << 30):.3g} GiB" if limit is not None else "its limit"
    note = (
        f"\ngfair: the kernel's OOM killer stopped {kills} process(es) of this job: it went over"
        f" its memory limit of {size} (GFAIR_JOB_MEMORY_PER_GPU x its GPUs on this node)\n"
    )
    with contextlib.suppress(OSError), job.run.open_output(job.run.stderr) as stderr:
        stderr.write(note.encode())


# Run as the job's account: make the working directory if it is missing, then require that the
# account may enter it and write there.
_WORKDIR_CHECK = 'mkdir -p -- "$1" && cd -- "$1" && test -w .'


async def _prepare_workdir(job_id: str, workdir: Path, account: JobAccount) -> None:
    """`JobStartError` unless `account` may work in `workdir` (made by it where missing)."""
    if not workdir.is_absolute():
        raise JobStartError(f"job {job_id}: working directory {workdir} is not absolute")
    result = await anyio.run_process(
        ["/bin/sh", "-c", _WORKDIR_CHECK, "gfair-workdir", str(workdir)],
        check=False,
        cwd="/",
        env={"PATH": os.defpath},
        user=account.uid,
        group=account.gid,
        extra_groups=(),
    )
    if result.returncode != 0:
        detail = result.stderr.decode(errors="replace").strip() or "not writable"
        raise JobStartError(
            f"job {job_id}: working directory {workdir} is not usable by the job's account "
            f"(uid {account.uid}): {detail}"
        )
