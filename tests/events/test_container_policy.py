"""The operator's rule on job images and host mounts, and the launch fields it is checked on."""

from __future__ import annotations

import pytest

from gfair.cli.main import build_parser
from gfair.cli.submission import job
from gfair.cli.submit import job_spec
from gfair.events.container_policy import ContainerPolicy
from gfair.events.job_spec import JobSpec
from gfair.events.submission import JobSubmitted

POLICY = ContainerPolicy(
    images=("registry.example.com/", "gfair-local/python:"), mount_roots=("/data",)
)


@pytest.mark.parametrize(
    ("image", "mounts", "refused"),
    [
        (None, (), None),  # a process: nothing to check
        ("registry.example.com/team/train:1", ("/data/set:/set:ro",), None),
        ("gfair-local/python:bookworm", ("/data:/data",), None),
        ("registry.example.com.evil/x", (), "is not allowed here"),
        ("docker.io/library/python:3", (), "is not allowed here"),
        ("gfair-local/python:bookworm", ("/database:/d",), "may not be mounted"),
        ("gfair-local/python:bookworm", ("/data/../etc:/etc2",), "may not be mounted"),
        ("gfair-local/python:bookworm", ("/var/run/docker.sock:/s",), "may not be mounted"),
    ],
)
def test_images_and_mounts_are_allowed_by_prefix_and_directory(
    image: str | None, mounts: tuple[str, ...], refused: str | None
) -> None:
    why = POLICY.refusal(image, mounts)
    assert (why is None) == (refused is None) and (refused is None or refused in (why or ""))


def test_by_default_no_image_and_no_mount_is_allowed() -> None:
    assert "none" in (ContainerPolicy().refusal("anything", ()) or "")
    allowed = ContainerPolicy(images=("x",))
    assert "none" in (allowed.refusal("x", ("/data:/data",)) or "")


def test_a_submission_of_the_previous_version_reads_as_a_process_job() -> None:
    old = {"user": "alice", "job_id": "j", "gpus": 1, "command": ["true"]}
    data = JobSubmitted.model_validate(old)
    assert data.image is None and data.mounts == ()


def test_the_command_line_carries_image_and_mounts_over_the_spec_file() -> None:
    spec = JobSpec(user="alice", gpus=1, command=("python", "t.py"), mounts=("/data/a:/a",))
    args = build_parser("submit").parse_args(
        ["submit", "--image", "registry.example.com/t:1", "--mount", "/data/b:/b:ro"]
    )
    submitted = job(job_spec(args, spec), "j")
    assert submitted.image == "registry.example.com/t:1"
    assert submitted.mounts == ("/data/a:/a", "/data/b:/b:ro")


@pytest.mark.parametrize("field", ["privileged", "user", "cap_add", "security_opt", "devices"])
def test_a_spec_file_asking_for_privileges_is_refused(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        JobSpec.model_validate({"image": "x", field: True})


def test_a_submission_asking_for_privileges_gets_none() -> None:
    # Unknown fields of an event are dropped (old and new services coexist): nothing carries
    # them to a node, whose containers are never privileged (gfair.node.container_jobs).
    data = JobSubmitted.model_validate(
        {"user": "a", "job_id": "j", "gpus": 1, "command": ["x"], "privileged": True}
    )
    assert "privileged" not in data.model_dump()
