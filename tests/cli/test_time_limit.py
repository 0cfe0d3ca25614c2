"""`gfair submit --time-limit` (Slurm's `--time`): read as the submission's `time_limit`, in
seconds, from the forms users write; a form it cannot read is a usage error naming the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from gfair.cli import submission
from gfair.cli.main import build_parser, main
from gfair.cli.submit import job_spec
from gfair.events.job_spec import JobSpec, load_job_spec

UNREACHABLE = ["--nats", "nats://127.0.0.1:1"]


def submitted_limit(*flags: str, spec: JobSpec | None = None) -> float | None:
    args = build_parser("submit").parse_args(
        ["submit", "--user", "alice", "--gpus", "1", *flags, "--", "true"]
    )
    return submission.job(job_spec(args, spec or JobSpec()), "j").time_limit


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        ("4h", 14400),
        ("90m", 5400),
        ("30s", 30),
        ("1h30m", 5400),
        ("2d", 172800),
        ("5400", 5400),
        ("7.5", 7.5),
        ("1-00:00:00", 86400),
        ("01:30:00", 5400),
    ],
)
def test_a_time_limit_is_read_in_the_forms_users_write(given: str, seconds: float) -> None:
    assert submitted_limit("--time-limit", given) == seconds
    assert submitted_limit("--time", given) == seconds  # Slurm's name for it


def test_no_time_limit_is_none_and_a_spec_files_is_read_alike(tmp_path: Path) -> None:
    assert submitted_limit() is None
    path = tmp_path / "job.yaml"
    path.write_text("time_limit: 1h30m\n")
    assert submitted_limit(spec=load_job_spec(path)) == 5400
    assert submitted_limit("--time-limit", "2h", spec=load_job_spec(path)) == 7200  # flag wins


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("4x", "--time-limit '4x': expected seconds or a duration"),
        ("0", "--time-limit 0: Input should be greater than 0"),
        ("01:75:00", "minutes and seconds run to 59"),
    ],
)
def test_a_bad_time_limit_exits_2_naming_the_flag(
    given: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["submit", "--user", "alice", "--gpus", "1", "--time-limit", given, *UNREACHABLE]
    assert main([*argv, "--", "true"]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
