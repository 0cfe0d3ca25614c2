"""Job references on the command line: ``USER/JOB``, or ``JOB`` with ``--user``."""

from __future__ import annotations

import pytest

from gfair.cli.session import job_reference


@pytest.mark.parametrize(
    ("text", "user", "expected"),
    [
        ("alice/j1", None, ("alice", "j1")),
        ("j1", "bob", ("bob", "j1")),
        ("alice/j1", "alice", ("alice", "j1")),
    ],
)
def test_job_references(text: str, user: str | None, expected: tuple[str, str]) -> None:
    assert job_reference(text, user) == expected


@pytest.mark.parametrize(
    ("text", "user", "message"),
    [("j1", None, "--user"), ("alice/j1", "bob", "belongs to"), ("alice/j.1", None, "job id")],
)
def test_bad_job_references(text: str, user: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        job_reference(text, user)
