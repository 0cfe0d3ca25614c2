"""The supervisor running real synthetic jobs (each about a second, thanks to --speed-scale)."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
from pathlib import Path

import anyio
import pytest

from gfair.node.job_runner import JobNotSupervised, JobStartError, SupervisorError
from gfair.node.launch import CheckpointRef, RunSpec
from gfair.node.lifecycle import CheckpointReport, ExitReport, ProgressReport
from gfair.node.progress import ProgressTail
from gfair.node.supervisor import JobSupervisor
from gfair.sdk import YIELD_EXIT_CODE
from gfair.sdk.progress import ProgressRecord
from gfair.sdk.throughput_table import ThroughputTable

from .helpers import (
    JOB_PYTHON,
    RESNET,
    EventLog,
    environ_of,
    make_config,
    python_job,
    synthetic,
    wait_for_text,
)


def assert_group_gone(pgid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


async def test_suspend_checkpoints_then_resume_continues_to_completion(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    # 2 V100s: 10.83 steps/s x 20 = ~217 steps/s, so 400 steps take ~1.8 s.
    launch = synthetic("job-a", (1, 2), "v100", "--iterations", "400", "--speed-scale", "20")
    async with JobSupervisor(config) as supervisor:
        log = EventLog(supervisor.events)
        job = await supervisor.start(launch)

        # Its own session and process group, CUDA_VISIBLE_DEVICES and the SDK's variables.
        assert job.pgid == job.pid == os.getpgid(job.pid) == os.getsid(job.pid)
        assert job.pgid != os.getpgrp()
        # /proc shows the new environment only once the child has exec'd: wait for the SDK.
        await wait_for_text(job.paths.control_dir / "progress.jsonl", '"kind":"ready"')
        environ = environ_of(job.pid)
        assert environ["CUDA_VISIBLE_DEVICES"] == "1,2"
        assert environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert environ["GFAIR_JOB_ID"] == "job-a"
        assert environ["GFAIR_GPU_GENERATION"] == "v100"
        assert environ["GFAIR_CHECKPOINT_DIR"] == str(config.checkpoint_root / "job-a")
        assert environ["GFAIR_CONTROL_DIR"] == str(job.paths.control_dir)
        assert supervisor.busy_gpus() == {1, 2}

        progress = await log.first(ProgressReport, lambda p: p.steps >= 40)
        result = await supervisor.suspend("job-a", timeout_s=10)

        assert result.fresh and result.escalation is None
        assert result.exit.yielded and not result.exit.completed
        assert result.exit.exit_code == YIELD_EXIT_CODE
        assert result.checkpoint is not None
        assert progress.steps <= result.checkpoint.step < 400
        assert result.exit.steps == result.checkpoint.step
        assert result.switch_s < 5
        assert supervisor.busy_gpus() == frozenset()
        assert_group_gone(job.pgid)
        checkpointed = log.of(CheckpointReport)
        assert checkpointed[-1].checkpoint == result.checkpoint

        # Resume elsewhere on the node (a migration is the same thing on another node).
        mark = log.mark()
        moved = dataclasses.replace(launch, gpu_indices=(0, 3), resume_from=result.checkpoint)
        resumed = await supervisor.start(moved)
        await wait_for_text(resumed.paths.control_dir / "progress.jsonl", '"kind":"ready"')
        assert environ_of(resumed.pid)["GFAIR_RESUME_CHECKPOINT"] == str(result.checkpoint.path)
        exited = await supervisor.wait("job-a")

    assert exited.exit_code == 0 and exited.completed and not exited.yielded
    assert exited.checkpoint is not None and exited.checkpoint.step == 400
    assert f"steps {result.checkpoint.step}..400" in resumed.paths.stdout.read_text()
    after = log.of(ProgressReport, after=mark)
    assert after, "the resumed run reported progress"
    assert all(p.steps > result.checkpoint.step for p in after), "restarted from scratch"
    assert resumed.paths.run_dir != job.paths.run_dir


async def test_a_job_deaf_to_yield_and_sigterm_is_killed_and_falls_back(tmp_path: Path) -> None:
    config = make_config(tmp_path, term_grace_s=0.5)
    launch = synthetic(
        "stuck", (0,), "v100",
        "--iterations", "10000", "--speed-scale", "20", "--checkpoint-every", "20",
        "--hang-at-step", "50", "--ignore-sigterm",
    )  # fmt: skip
    async with JobSupervisor(config) as supervisor:
        log = EventLog(supervisor.events)
        job = await supervisor.start(launch)
        await log.first(CheckpointReport, lambda c: c.checkpoint.step == 40)
        await wait_for_text(job.paths.stderr, "hanging at step 50")

        result = await supervisor.suspend("stuck", timeout_s=0.5)

    assert result.escalation == "SIGKILL"
    assert result.exit.signal == signal.SIGKILL and result.exit.exit_code is None
    assert result.exit.terminated_by == "SIGKILL"
    assert result.exit.reason == "did not yield within 0.5s"
    assert result.exit.yielded  # forced, but the GPUs were asked back: not a failure
    assert not result.fresh
    assert result.checkpoint is not None and result.checkpoint.step == 40
    assert result.switch_s >= 0.5 + 0.5
    assert_group_gone(job.pgid)


async def test_a_hung_job_that_honours_sigterm_stops_there(tmp_path: Path) -> None:
    config = make_config(tmp_path, term_grace_s=5.0)
    launch = synthetic("hung", (0,), "k80", "--iterations", "100", "--hang-at-step", "0")
    async with JobSupervisor(config) as supervisor:
        job = await supervisor.start(launch)
        await wait_for_text(job.paths.stderr, "hanging at step 0")
        result = await supervisor.suspend("hung", timeout_s=0.3)

    assert result.escalation == "SIGTERM"
    assert result.exit.signal == signal.SIGTERM
    assert result.checkpoint is None and not result.fresh  # nothing to resume from: step 0
    assert result.switch_s < 5.0


async def test_a_job_sees_none_of_the_executors_settings_or_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a node executor's environment holds (docs: issue 11, the first attack).
    for name, value in {
        "GFAIR_NATS_URL": "nats://broker:4222",
        "GFAIR_NATS_USER": "node",
        "GFAIR_NATS_PASSWORD": "s3cret",
        "GFAIR_NODE_ID": "v100-0",
        "NATS_CREDS": "/etc/nats/node.creds",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "LC_ALL": "C.UTF-8",
    }.items():
        monkeypatch.setenv(name, value)
    launch = dataclasses.replace(
        synthetic("plain", (0,), "v100", "--iterations", "100000"), env={"MY_SEED": "7"}
    )
    async with JobSupervisor(make_config(tmp_path)) as supervisor:
        job = await supervisor.start(launch)
        await wait_for_text(job.paths.control_dir / "progress.jsonl", '"kind":"ready"')
        environ = environ_of(job.pid)
        await supervisor.kill("plain", "seen enough")
    assert not [name for name in environ if "NATS" in name or name.startswith("OTEL_")]
    assert "GFAIR_NODE_ID" not in environ and "s3cret" not in environ.values()
    # What it does get: its own variables, its GPUs, the SDK's, and what a program needs.
    assert environ["MY_SEED"] == "7" and environ["CUDA_VISIBLE_DEVICES"] == "0"
    assert environ["GFAIR_JOB_ID"] == "plain" and environ["LC_ALL"] == "C.UTF-8"
    assert environ["PATH"] == os.environ["PATH"]


async def test_a_jobs_math_libraries_get_its_share_of_the_nodes_cpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The executor's own setting never reaches a job: the share does.
    monkeypatch.setenv("OMP_NUM_THREADS", "64")
    long = ("--iterations", "100000")
    launches = {
        "pair": synthetic("pair", (0, 1), "v100", *long),
        "single": synthetic("single", (2,), "v100", *long),
        "own": dataclasses.replace(
            synthetic("own", (3,), "v100", *long), env={"OMP_NUM_THREADS": "4"}
        ),
    }
    seen: dict[str, str | None] = {}
    for threads_per_gpu in (1.5, None):
        config = make_config(tmp_path / str(threads_per_gpu), threads_per_gpu=threads_per_gpu)
        async with JobSupervisor(config) as supervisor:
            for name, launch in launches.items():
                job = await supervisor.start(launch)
                await wait_for_text(job.paths.control_dir / "progress.jsonl", '"kind":"ready"')
                seen[f"{name} {threads_per_gpu}"] = environ_of(job.pid).get("OMP_NUM_THREADS")
                await supervisor.kill(name, "seen enough")
    assert seen == {
        # 1.5 per GPU, rounded down; at least one.
        "pair 1.5": "3",
        "single 1.5": "1",
        # A job that sets it keeps its own.
        "own 1.5": "4",
        # Off: the libraries' defaults.
        "pair None": None,
        "single None": None,
        "own None": "4",
    }


# A job whose child leaves its process group (a new session) and writes its pid down, then
# trains: killing the group alone would leave the child running.
ESCAPER = (
    JOB_PYTHON,
    "-c",
    "import os, subprocess, sys;"
    "child = subprocess.Popen(['sleep', '600'], start_new_session=True);"
    "open(os.environ['GFAIR_CONTROL_DIR'] + '/escapee', 'w').write(str(child.pid));"
    "os.execv(sys.executable, [sys.executable, '-m', 'gfair.sdk.synthetic', '--iterations',"
    " '100000', '--speed-scale', '0.01'])",
)


@pytest.mark.parametrize("stop", ["kill", "suspend"])
async def test_a_process_that_left_the_jobs_group_goes_with_the_job(
    tmp_path: Path, stop: str
) -> None:
    launch = dataclasses.replace(synthetic("escaper", (0,), "v100"), argv=ESCAPER)
    async with JobSupervisor(make_config(tmp_path)) as supervisor:
        job = await supervisor.start(launch)
        await wait_for_text(job.paths.control_dir / "progress.jsonl", '"kind":"ready"')
        escapee = int((job.paths.control_dir / "escapee").read_text())
        assert os.getsid(escapee) != job.pgid  # it did leave the job's session
        if stop == "kill":
            await supervisor.kill("escaper", "cancelled")
        else:
            await supervisor.suspend("escaper", 5.0)
        with pytest.raises(ProcessLookupError):
            os.kill(escapee, 0)


async def test_oom_exit_carries_code_and_stderr_tail(tmp_path: Path) -> None:
    launch = synthetic("oom", (0,), "v100", "--iterations", "100", "--speed-scale", "50",
                       "--oom-at-step", "10")  # fmt: skip
    async with JobSupervisor(make_config(tmp_path)) as supervisor:
        log = EventLog(supervisor.events)
        await supervisor.start(launch)
        exited = await log.first(ExitReport)

    assert exited.exit_code == 1 and exited.signal is None
    assert "CUDA out of memory" in exited.stderr_tail
    assert not exited.yielded and not exited.completed and exited.terminated_by is None
    assert exited.steps == 10
    assert exited.duration_s > 0


async def test_failure_exit_code_and_bounded_stderr_tail(tmp_path: Path) -> None:
    config = make_config(tmp_path, stderr_tail_bytes=64)
    noisy = RunSpec(
        job_id="noisy",
        argv=(JOB_PYTHON, "-c",
              "import sys\nfor i in range(500): print(f'line {i}', file=sys.stderr)\nsys.exit(3)"),
        gpu_indices=(2,),
        generation="v100",
    )  # fmt: skip
    async with JobSupervisor(config) as supervisor:
        await supervisor.start(noisy)
        exited = await supervisor.wait("noisy")
    assert exited.exit_code == 3
    assert exited.stderr_tail.endswith("line 499\n")
    assert len(exited.stderr_tail.encode()) <= 64
    assert exited.stderr_tail.startswith("line ")  # cut at a line boundary


async def test_speed_follows_the_measured_table_per_generation(tmp_path: Path) -> None:
    table = ThroughputTable.load()
    scale = 20.0
    expected = {g: table.steps_per_s(RESNET, g) * scale for g in ("v100", "k80")}
    config = make_config(tmp_path, rate_window_s=1.0)
    args = ("--iterations", "100000", "--speed-scale", str(scale))
    async with JobSupervisor(config) as supervisor:
        log = EventLog(supervisor.events)
        await supervisor.start(synthetic("fast", (0,), "v100", *args))
        await supervisor.start(synthetic("slow", (1,), "k80", *args))
        await anyio.sleep(1.6)  # pause under test: they run past a rate window (1 s)
        measured: dict[str, float] = {}
        for job_id, generation in (("fast", "v100"), ("slow", "k80")):
            latest = [p for p in log.of(ProgressReport) if p.job_id == job_id][-1]
            assert latest.rate_per_s is not None
            measured[generation] = latest.rate_per_s
        await supervisor.kill("fast", "test over")
        await supervisor.kill("slow", "test over")

    for generation, rate in measured.items():
        assert rate == pytest.approx(expected[generation], rel=0.3), generation
    assert measured["v100"] / measured["k80"] == pytest.approx(
        expected["v100"] / expected["k80"], rel=0.3
    )


async def test_shutdown_checkpoints_then_kills_everything(tmp_path: Path) -> None:
    config = make_config(tmp_path, shutdown_timeout_s=1.0, term_grace_s=0.3)
    synthetic_cmd = " ".join(
        [*synthetic("x", (0,), "v100").argv[:3], "--job-type", f"'{RESNET}'",
         "--iterations", "100000", "--speed-scale", "20"]
    )  # fmt: skip
    # A leader that leaves a background child in its group, as shell wrappers and data loaders do.
    wrapped = RunSpec(
        job_id="wrapped",
        argv=("/bin/sh", "-c", f"sleep 300 & exec {synthetic_cmd}"),
        gpu_indices=(0,),
        generation="v100",
    )
    deaf = synthetic("deaf", (1,), "v100", "--iterations", "1000", "--hang-at-step", "0",
                     "--ignore-sigterm")  # fmt: skip
    async with JobSupervisor(config) as supervisor:
        log = EventLog(supervisor.events)
        first = await supervisor.start(wrapped)
        second = await supervisor.start(deaf)
        await log.first(ProgressReport, lambda p: p.job_id == "wrapped" and p.steps > 10)
        await wait_for_text(second.paths.stderr, "hanging at step 0")
        results = await supervisor.shutdown()
        with pytest.raises(SupervisorError, match="not running"):
            await supervisor.start(synthetic("late", (3,), "v100", "--iterations", "1"))

    by_job = {r.job_id: r for r in results}
    assert by_job["wrapped"].fresh and by_job["wrapped"].exit.yielded
    assert by_job["deaf"].escalation == "SIGKILL"
    assert_group_gone(first.pgid)  # including the background `sleep`
    assert_group_gone(second.pgid)


async def test_leaving_the_block_without_shutdown_still_leaves_no_orphans(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path, shutdown_timeout_s=2.0)
    with pytest.raises(RuntimeError, match="executor crashed"):
        async with JobSupervisor(config) as supervisor:
            job = await supervisor.start(
                synthetic("left", (0,), "v100", "--iterations", "100000", "--speed-scale", "20")
            )
            await wait_for_text(job.paths.control_dir / "progress.jsonl", '"kind":"step"')
            raise RuntimeError("executor crashed")
    assert_group_gone(job.pgid)
    assert (job.paths.run_dir / "exit.json").exists()


async def test_requests_that_cannot_be_honoured_are_refused(tmp_path: Path) -> None:
    async with JobSupervisor(make_config(tmp_path)) as supervisor:
        await supervisor.start(synthetic("a", (0, 1), "v100", "--iterations", "100000"))
        with pytest.raises(SupervisorError, match="already running"):
            await supervisor.start(synthetic("a", (2,), "v100", "--iterations", "1"))
        with pytest.raises(SupervisorError, match=re.escape("GPUs [1] are in use")):
            await supervisor.start(synthetic("b", (1, 2), "v100", "--iterations", "1"))
        with pytest.raises(SupervisorError, match=re.escape("no GPU [7]")):
            await supervisor.start(synthetic("b", (7,), "v100", "--iterations", "1"))
        with pytest.raises(JobStartError, match="cannot start '/nonexistent/python'"):
            await supervisor.start(
                RunSpec("c", ("/nonexistent/python",), gpu_indices=(3,), generation="v100")
            )
        missing = CheckpointRef(4, 40, tmp_path / "elsewhere" / "ckpt-000000000004", 0.0)
        with pytest.raises(JobStartError, match="not usable here"):
            await supervisor.start(
                synthetic("d", (3,), "v100", "--iterations", "1", resume_from=missing)
            )
        with pytest.raises(JobNotSupervised):
            await supervisor.suspend("nobody", timeout_s=1)
        with pytest.raises(ValueError, match="must match"):
            RunSpec("../etc", ("true",), gpu_indices=(0,), generation="v100")
        assert supervisor.busy_gpus() == {0, 1}
        exited = await supervisor.kill("a", "cancelled by user")
    assert exited.reason == "cancelled by user" and exited.terminated_by == "SIGTERM"
    assert not exited.yielded


async def test_a_suspend_sent_before_the_sdk_is_up_is_still_honoured(tmp_path: Path) -> None:
    # The request races the interpreter start-up: SIGUSR1 cannot be used yet (it would kill),
    # so the yield file must carry it.
    launch = synthetic("early", (0,), "v100", "--iterations", "100000", "--speed-scale", "20")
    async with JobSupervisor(make_config(tmp_path)) as supervisor:
        job = await supervisor.start(launch)
        result = await supervisor.suspend("early", timeout_s=10)

    assert result.exit.exit_code == YIELD_EXIT_CODE and result.escalation is None
    assert result.fresh and result.checkpoint is not None and result.checkpoint.step >= 1
    assert_group_gone(job.pgid)


async def test_a_reader_that_raises_still_lets_the_job_end_and_its_exit_be_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: ProgressTail) -> list[ProgressRecord]:
        raise RuntimeError("a reader bug")

    monkeypatch.setattr(ProgressTail, "read", broken)
    job = dataclasses.replace(
        synthetic("r", (0,), "v100"), argv=(JOB_PYTHON, "-c", "import time; time.sleep(0.5)")
    )
    async with JobSupervisor(make_config(tmp_path)) as supervisor:
        await supervisor.start(job)
        with anyio.fail_after(20):
            exited = await supervisor.wait("r")
        assert exited.exit_code == 0 and exited.signal is None
        assert supervisor.running() == []


async def test_a_node_that_runs_no_containers_refuses_a_job_in_an_image(tmp_path: Path) -> None:
    # Run as a process instead, its command would find none of its image's programs.
    launch = dataclasses.replace(python_job("job-i", "pass"), image="registry.example.com/t:1")
    async with JobSupervisor(make_config(tmp_path)) as supervisor:
        with pytest.raises(JobStartError, match="runs no job in a container image"):
            await supervisor.start(launch)
        assert supervisor.running() == []
