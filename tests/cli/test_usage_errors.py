"""Flags no cluster would accept exit 2 with one line naming the flag, before connecting: the
NATS URL given cannot be reached, so a command that tried to send would exit 3 instead."""

from __future__ import annotations

import pytest

from gfair.cli.main import main
from gfair.events.admission_limits import MAX_JOB_GPUS

UNREACHABLE = ["--nats", "nats://127.0.0.1:1"]
COMMAND = ["--", "true"]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--gpus", "0"], "--gpus 0: a job asks for 1 to"),
        (["--gpus", "10000"], f"--gpus 10000: a job asks for 1 to {MAX_JOB_GPUS} GPUs"),
        (["--gpus", "1", "--env", "BADENV"], "--env 'BADENV': expected NAME=VALUE"),
        (["--gpus", "1", "--env", "1X=2"], "'1X' is not a variable name"),
        (["--gpus", "1", "--job-id", "a/b"], "--job-id must be 1 to 64"),
        (["--gpus", "1", "--tickets", "-1"], "--tickets -1:"),
        (["--gpus", "1", "--max-retries", "-3"], "--max-retries -3:"),
        (["--gpus", "1", "--workdir", "relative"], "--workdir 'relative': must be an absolute"),
        (["--gpus", "1", "--timeout", "-1"], "--timeout -1: must be a positive"),
        (["--gpus", "1", "--mount", "/data:/data"], "mounts are for a job in a container image"),
        (["--gpus", "1", "--image", "x", "--mount", "data:/d"], "must be HOST:CONTAINER"),
        (["--gpus", "1", "--image", "x", "--mount", "/a:/b:rw"], "the only option is ro"),
        (["--gpus", "1", "--image", "Bad Image"], "--image 'Bad Image':"),
    ],
)
def test_a_bad_submit_flag_exits_2_naming_it(
    flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["submit", "--user", "alice", *flags, *UNREACHABLE, *COMMAND]) == 2
    err = capsys.readouterr().err
    assert says in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_placement_limit_is_the_one_the_cli_states() -> None:
    from gfair_services.placement.settings import PlacementSettings

    assert PlacementSettings().max_job_gpus == MAX_JOB_GPUS


@pytest.mark.parametrize("command", ["job", "why", "wait", "cancel", "logs"])
@pytest.mark.parametrize("reference", ["nosuch", "alice/b/c", "alice/"])
def test_a_bad_job_reference_exits_2(
    command: str,
    reference: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GFAIR_USER", raising=False)
    assert main([command, reference, *UNREACHABLE]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gfair: job {reference!r}") and err.count("\n") == 1


def test_a_good_reference_goes_on_to_connect(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["job", "alice/nosuch", *UNREACHABLE]) == 3
