"""Job arrays and dependencies through `gfair submit/jobs/why/wait/cancel`, on a real
nats-server running the control plane (placement holds and releases, split-stride's ledger caps
an array's running members)."""

from __future__ import annotations

import asyncio
import json

import pytest

from gfair.cli.main import main
from gfair.client import GfairClient
from gfair.events.jobs import JobCompleted, JobFailed
from gfair.events.reasons import FailureClass
from support.waiting import eventually_sync

from .test_tool_commands import COMMAND, Gfair, gfair, publish, quiet_services

__all__ = ["gfair", "quiet_services"]  # fixtures


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--array", "5-2"], "ends before it starts"),
        (["--array", "0-9%0"], "whole number >= 1"),
        (["--array", "0-3", "--wait=running"], "not for running"),
        (["--array", "0-3", "--job-id", "x" * 63], "not a job id"),
        (["--after-ok", "bob/x"], "same user"),
        (["--after-ok", "a,,b"], "empty job id"),
    ],
)
def test_bad_batch_flags_exit_2_with_the_reason_before_connecting(
    flags: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["submit", "--user", "alice", "--gpus", "1", "--nats", "nats://127.0.0.1:1"]
    assert main([*argv, *flags, *COMMAND]) == 2
    assert says in capsys.readouterr().err


def _stride_holders(url: str, user: str, array: str) -> int:
    async def read() -> int:
        client = await GfairClient.connect(url)
        async with client:
            stride = await client.stride()
        if stride is None:
            return 0
        return sum(
            1
            for job in stride.jobs.values()
            if job.user == user and job.array == array and job.residency
        )

    return asyncio.run(read())


pytestmark = pytest.mark.nats


def test_an_array_is_capped_by_the_scheduler_and_addressed_as_a_whole(gfair: Gfair) -> None:
    out = gfair.json(
        "submit", "--user", "alice", "--gpus", "1", "--array", "0-5%2", "--job-id", "sweep",
        *COMMAND,
    )  # fmt: skip
    assert out["array_id"] == "sweep" and out["limit"] == 2
    assert [j["job_id"] for j in out["jobs"]] == [f"sweep-{i}" for i in range(6)]
    assert {j["state"] for j in out["jobs"]} <= {"queued", "placed"}
    listed = gfair.json("jobs", "--user", "alice", "--array", "sweep")
    assert len(listed) == 6 and all(r["submission"]["array"]["limit"] == 2 for r in listed)
    # Two servers of 4 GPUs could hold all six: split-stride starts two.
    eventually_sync(lambda: _stride_holders(gfair.url, "alice", "sweep") == 2)
    assert _stride_holders(gfair.url, "alice", "sweep") == 2
    code, out_text, _ = gfair("why", "alice/sweep-5")
    assert code == 0 and "runs at most 2 at once" in out_text
    # The array's id, as `wait` and `cancel` take it: every member explained.
    code, out_text, err = gfair("why", "alice/sweep")
    assert code == 0, err
    assert "alice/sweep: array of 6 job(s)" in out_text
    assert all(f"alice/sweep-{i}" in out_text for i in range(6))
    explained = gfair.json("why", "alice/sweep")
    assert [e["job_id"] for e in explained] == [f"sweep-{i}" for i in range(6)]
    code, _, _ = gfair("cancel", "alice/sweep", "--json")
    assert code == 0
    code, out_text, _ = gfair("wait", "alice/sweep", "--json", "--timeout", "10")
    assert code == 5  # every member cancelled
    assert out_text.count('"cancelled"') == 6


def test_dependencies_hold_release_and_cancel_down_the_chain(gfair: Gfair) -> None:
    for job_id in ("prep", "flaky"):
        gfair.submit("alice", "--job-id", job_id)
    held = gfair.submit("alice", "--job-id", "train", "--after-ok", "prep")
    assert held["state"] == "held"
    chain = [
        gfair.submit("alice", "--job-id", "fit", "--after-ok", "flaky,prep"),
        gfair.submit("alice", "--job-id", "report", "--after-ok", "fit"),
    ]
    assert [c["state"] for c in chain] == ["held", "held"]
    code, out, _ = gfair("why", "alice/train")
    assert code == 0 and "held until prep complete" in out
    table = gfair("jobs", "--user", "alice")[1]
    assert "held (after prep)" in table
    # Another user's job of the same id is not alice's: unknown to her.
    gfair.submit("bob", "--job-id", "shared")
    code, out, _ = gfair("submit", "--user", "alice", "--gpus", "1", "--after-ok", "shared",
                         "--json", *COMMAND)  # fmt: skip
    assert code == 1
    rejected = json.loads(out)
    assert rejected["code"] == "unknown_dependency" and "shared" in rejected["reason"]

    publish(gfair.url, JobCompleted(user="alice", job_id="prep", attempt=1))
    eventually_sync(lambda: gfair.json("job", "alice/train")["state"] in ("queued", "placed"))
    events = [e["type"] for e in gfair.json("job", "alice/train")["events"]]
    assert events[:2] == ["gfair.job.held.v1", "gfair.job.accepted.v1"]
    assert gfair.json("job", "alice/fit")["state"] == "held"  # still waits for flaky

    publish(
        gfair.url,
        JobFailed(
            user="alice",
            job_id="flaky",
            failure_class=FailureClass.USER_ERROR,
            reason="exit code 3",
            attempt=1,
        ),
    )
    eventually_sync(lambda: gfair.json("job", "alice/report")["state"] == "cancelled")
    fit = gfair.json("job", "alice/fit")["record"]
    report = gfair.json("job", "alice/report")["record"]
    assert fit["state"] == "cancelled" and "dependency flaky failed" in fit["reason"]
    assert "dependency fit cancelled" in report["reason"]
    assert fit["cancelled_from"] == "held"
    code, _, _ = gfair("wait", "alice/report", "--timeout", "5")
    assert code == 5
    # A dependency that already failed is refused at once.
    code, out, _ = gfair("submit", "--user", "alice", "--gpus", "1", "--after-ok", "flaky",
                         "--json", *COMMAND)  # fmt: skip
    assert code == 1 and json.loads(out)["code"] == "dependency_failed"
    # And one that already completed is no dependency at all.
    assert gfair.submit("alice", "--after-ok", "prep")["state"] in ("queued", "placed")
