"""The lifecycle a kind of job gets from `JobRunner` by saying only how a run starts, yields,
is signalled and is watched: here a kind whose runs are in-memory scripts (as a container kind
would be one whose runs are the engine's)."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest

from gfair.node.job_runner import JobRunner, SupervisedRun, SupervisorConfig, SupervisorError
from gfair.node.launch import JobPaths, RunningJob, RunSpec
from gfair.node.lifecycle import ExitReport, SuspendResult
from gfair.sdk.environment import YIELD_EXIT_CODE


@dataclass(eq=False)
class _Scripted(SupervisedRun):
    yields: bool  # exits with the yield code when asked to yield
    ignores_sigterm: bool
    signals: list[int] = field(default_factory=list)
    returncode: int | None = None
    ended: anyio.Event = field(default_factory=anyio.Event)

    def end(self, returncode: int) -> None:
        if self.returncode is None:
            self.returncode = returncode
            self.ended.set()


class _ScriptRunner(JobRunner[_Scripted]):
    def __init__(self, config: SupervisorConfig) -> None:
        super().__init__(config)
        self.launched: dict[str, _Scripted] = {}

    async def _launch(self, launch: RunSpec) -> _Scripted:
        root = self.config.run_root / launch.job_id
        paths = JobPaths(root, root, root, root / "out", root / "err", root / "ckpt")
        handle = RunningJob(
            launch.job_id, launch.attempt, 0, 0, launch.gpu_indices, launch.generation,
            time.time(), paths,
        )  # fmt: skip
        run = _Scripted(
            handle=handle,
            started_monotonic=time.monotonic(),
            yields="yields" in launch.argv,
            ignores_sigterm="ignores-sigterm" in launch.argv,
        )
        self.launched[launch.job_id] = run
        return run

    async def _watch(self, run: _Scripted) -> None:
        await run.ended.wait()
        assert run.returncode is not None
        code = run.returncode
        exited = run.settle(code if code >= 0 else None, -code if code < 0 else None, "",
                            completed=False)  # fmt: skip
        self._exited(run)
        await self._deliver(exited)
        run.exited.set()

    async def _suspend(
        self, run: _Scripted, timeout_s: float, *, enforce: bool, park: bool
    ) -> SuspendResult:
        requested = time.monotonic()
        run.yield_requested = True
        if run.yields:
            run.end(YIELD_EXIT_CODE)
        with anyio.move_on_after(timeout_s):
            await run.exited.wait()
        return await self._force_off(
            run, timeout_s, enforce=enforce, before_seq=None, requested_at=requested
        )

    def _signal(self, run: _Scripted, signum: signal.Signals) -> None:
        run.signals.append(signum)
        if signum == signal.SIGKILL or not run.ignores_sigterm:
            run.end(-signum)


def _config(tmp_path: Path) -> SupervisorConfig:
    return SupervisorConfig(
        "n1", tmp_path / "run", tmp_path / "ckpt", term_grace_s=0.05, shutdown_timeout_s=0.05
    )


def _launch(job_id: str, *behaviour: str, gpus: tuple[int, ...] = (0,)) -> RunSpec:
    return RunSpec(job_id, ("script", *behaviour), gpus, "v100")


async def test_a_run_that_yields_frees_its_gpus_and_its_exit_is_reported_once(
    tmp_path: Path,
) -> None:
    async with _ScriptRunner(_config(tmp_path)) as runner:
        await runner.start(_launch("j1", "yields"))
        with pytest.raises(SupervisorError, match="in use"):
            await runner.start(_launch("j2"))
        result = await runner.suspend("j1", timeout_s=1.0)
        assert result.escalation is None
        assert result.exit.yielded and result.exit.exit_code == YIELD_EXIT_CODE
        assert runner.running() == [] and runner.busy_gpus() == frozenset()
        # Asked again after the fact: the same exit, nothing signalled.
        assert (await runner.suspend("j1", timeout_s=1.0)).exit == result.exit
        await runner.start(_launch("j2", "yields"))
        reported = await runner.events.receive()
    assert isinstance(reported, ExitReport) and reported.job_id == "j1"


@pytest.mark.parametrize(
    ("enforce", "sent"), [(False, [signal.SIGTERM, signal.SIGKILL]), (True, [signal.SIGKILL])]
)
async def test_a_run_that_ignores_its_yield_is_forced_off_and_counts_as_yielded(
    tmp_path: Path, enforce: bool, sent: list[int]
) -> None:
    async with _ScriptRunner(_config(tmp_path)) as runner:
        await runner.start(_launch("j1", "ignores-sigterm"))
        result = await runner.suspend("j1", timeout_s=0.05, enforce=enforce)
        run_exit = result.exit
    assert result.escalation == "SIGKILL" and run_exit.terminated_by == "SIGKILL"
    assert run_exit.signal == signal.SIGKILL and run_exit.yielded  # forced: still a yield
    assert run_exit.reason == "did not yield within 0.05s"
    assert runner.launched["j1"].signals == sent


async def test_a_kill_is_no_yield_and_leaving_stops_every_run(tmp_path: Path) -> None:
    async with _ScriptRunner(_config(tmp_path)) as runner:
        await runner.start(_launch("j1"))
        await runner.start(_launch("j2", "ignores-sigterm", gpus=(1,)))
        killed = await runner.kill("j1", "cancelled")
        assert killed.signal == signal.SIGTERM and not killed.yielded
        assert killed.terminated_by == "SIGTERM" and killed.reason == "cancelled"
    # Left: j2 was asked to yield, ignored it and SIGTERM, and was killed.
    assert runner.running() == [] and runner.launched["j2"].signals[-1] == signal.SIGKILL
    with pytest.raises(SupervisorError, match="not running"):
        await runner.start(_launch("j3"))
