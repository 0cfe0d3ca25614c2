"""The tool commands (`gfair submit`, `jobs`, `job`, `cancel`, `why`, `users`, `nodes`) on a
real nats-server running the control plane: JSON shapes, tables, errors and exit codes."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from client.live_cluster import control_plane_thread, registration
from gfair.bus.job_output import OUTPUTS, OutputChunk, publish_chunk
from gfair.bus.logs import configure_logging
from gfair.bus.nats_bus import NatsBus, NatsOptions
from gfair.bus.publisher import EventPublisher
from gfair.cli.main import main
from gfair.events.envelope import EventData
from gfair.events.jobs import JobCompleted, JobFailed, JobStarted
from gfair.events.reasons import FailureClass
from support.waiting import consistently_sync, eventually_sync

COMMAND = ["--", "python", "-m", "gfair.sdk.synthetic", "--iterations", "10"]


class Gfair:
    """Runs `gfair ...` in this process against one cluster, capturing what it prints."""

    def __init__(self, url: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.url = url
        self.capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(self.with_flags(argv, "--nats", self.url))
        out, err = self.capsys.readouterr()
        return code, out, err

    @staticmethod
    def with_flags(argv: tuple[str, ...], *flags: str) -> list[str]:
        """`flags` added before the job's command (after `--` everything is the command's)."""
        cut = argv.index("--") if "--" in argv else len(argv)
        return [*argv[:cut], *flags, *argv[cut:]]

    def json(self, *argv: str) -> Any:
        code, out, err = self(*self.with_flags(argv, "--json"))
        assert code == 0, err
        return json.loads(out)

    def submit(self, user: str, *flags: str) -> dict[str, Any]:
        found: dict[str, Any] = self.json("submit", "--user", user, "--gpus", "1", *flags, *COMMAND)
        return found


@pytest.fixture
def quiet_services(tmp_path: Path) -> Iterator[None]:
    """Services log to a file, not to the stdout the commands print their JSON on."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    with (tmp_path / "services.log").open("w") as log:
        configure_logging("test-control-plane", level="WARNING", stream=log)
        try:
            yield
        finally:
            structlog.configure(**saved)
            root.handlers[:], root.level = handlers, level


@pytest.fixture
def gfair(
    nats_url: str,
    capsys: pytest.CaptureFixture[str],
    quiet_services: None,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Gfair]:
    monkeypatch.setenv("COLUMNS", "200")  # tables as wide as a real terminal's
    nodes = (registration("v100-0", "v100"), registration("k80-0", "k80"))
    with control_plane_thread(nats_url, *nodes):
        yield Gfair(nats_url, capsys)


pytestmark = pytest.mark.nats


def test_submit_then_list_show_explain_and_cancel(gfair: Gfair) -> None:
    submitted = gfair.submit("alice", "--name", "resnet", "--env", "SEED=1")
    assert set(submitted) == {
        "user",
        "job_id",
        "event_id",
        "state",
        "reason",
        "code",
        "servers",
        "timed_out",
    }
    assert submitted["state"] in ("queued", "placed") and submitted["user"] == "alice"
    job_id = submitted["job_id"]

    eventually_sync(
        lambda: any(r["job_id"] == job_id for r in gfair.json("jobs", "--user", "alice"))
    )
    (record,) = gfair.json("jobs", "--user", "alice")
    assert record["submission"]["env"] == {"SEED": "1"}
    assert record["submission"]["command"] == COMMAND[1:]
    assert record["submission"]["prepare"] is False
    assert "applied_event_ids" not in record
    assert gfair.json("jobs", "--user", "bob") == []

    shown = gfair.json("job", f"alice/{job_id}")
    assert set(shown) == {"user", "job_id", "state", "record", "events", "profile", "failures"}
    assert shown["events"][0]["type"] == "gfair.job.accepted.v1"
    assert set(shown["events"][0]) == {
        "sequence",
        "id",
        "type",
        "time",
        "source",
        "subject",
        "data",
    }
    assert gfair.json("job", job_id, "--user", "alice")["job_id"] == job_id

    why = gfair.json("why", f"alice/{job_id}")
    assert set(why) == {"user", "job_id", "state", "headline", "reasons"}
    assert why["headline"].startswith(f"alice/{job_id}")

    code, out, _ = gfair("jobs")
    assert code == 0 and f"alice/{job_id}" in out

    cancelled = gfair.json("cancel", f"alice/{job_id}")
    assert cancelled == {"user": "alice", "job_id": job_id, "state": "cancelled"}
    eventually_sync(lambda: gfair.json("jobs", "--state", "cancelled") != [])


def test_submit_prepare_says_so_in_the_submission(gfair: Gfair) -> None:
    job_id = gfair.submit("alice", "--prepare")["job_id"]
    eventually_sync(
        lambda: any(r["job_id"] == job_id for r in gfair.json("jobs", "--user", "alice"))
    )
    (record,) = gfair.json("jobs", "--user", "alice")
    assert record["submission"]["prepare"] is True


def test_users_and_nodes(gfair: Gfair) -> None:
    gfair.submit("alice", "--job-type", "ResNet-50 (batch size 32)")
    gfair.submit("bob", "--job-type", "A3C")

    def both_entitled() -> bool:
        users = gfair.json("users")["users"]
        return {u["user"] for u in users if u["entitled"] > 0} == {"alice", "bob"}

    eventually_sync(both_entitled)
    view = gfair.json("users")
    assert view["capacity"] == {"k80": 4, "v100": 4}
    alice = next(u for u in view["users"] if u["user"] == "alice")
    assert set(alice["pools"]) == {"k80", "v100"}
    assert set(alice["pools"]["v100"]) == {"fair", "entitled", "gpu_seconds", "received"}
    code, out, _ = gfair("users")
    assert code == 0 and "alice" in out and "bob" in out

    eventually_sync(lambda: {n["node_id"] for n in gfair.json("nodes")} == {"k80-0", "v100-0"})
    code, out, _ = gfair("nodes")
    assert code == 0 and "v100-0" in out
    uncordoned = gfair.json("nodes", "uncordon", "v100-0")
    assert uncordoned["node_id"] == "v100-0" and uncordoned["event_id"]


def test_errors_have_messages_and_exit_codes(gfair: Gfair) -> None:
    code, _, err = gfair("job", "alice/never-submitted")
    # Not found is a failed request (1), in one line; a reference without its user is usage (2).
    assert code == 1 and "no job alice/never-submitted" in err and err.count("\n") == 1
    code, _, err = gfair("job", "never-submitted")
    assert code == 2 and "--user" in err
    code, _, err = gfair("nodes", "uncordon", "no-such-node")
    assert code == 1 and "unknown node" in err
    code, out, err = gfair("submit", "--json", "--user", "alice", "--gpus", "64", *COMMAND)
    assert code == 1 and json.loads(out)["state"] == "rejected"
    code, _, err = gfair("submit", "--user", "alice", "--gpus", "1")
    assert code == 2 and "command" in err
    code, _, err = gfair("submit", "--user", "alice", "--gpus", "1", "--env", "NOEQUALS", *COMMAND)
    assert code == 2 and "NAME=VALUE" in err
    code, out, err = gfair("submit", "--user", "alice", "--gpus", "1", "--wait", "--timeout", "1",
                           "--job-id", "slow", *COMMAND)  # fmt: skip
    assert code == 4 and "alice/slow" in out and "still waiting" in out


def test_an_unreachable_server_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["jobs", "--nats", "nats://127.0.0.1:1"])
    assert code == 3
    assert "cannot reach NATS" in capsys.readouterr().err


def test_follow_prints_events_until_the_job_ends(gfair: Gfair) -> None:
    job_id = gfair.submit("alice")["job_id"]
    codes: list[int] = []
    follower = threading.Thread(
        target=lambda: codes.append(
            main(["job", f"alice/{job_id}", "--follow", "--json", "--nats", gfair.url])
        )
    )
    follower.start()
    consistently_sync(follower.is_alive, 1.0)  # it prints what happened so far, then waits
    assert main(["cancel", f"alice/{job_id}", "--no-wait", "--nats", gfair.url]) == 0
    follower.join(20)
    assert not follower.is_alive() and codes == [0]
    # NDJSON: the job on one line, then one line per event that came after.
    out = gfair.capsys.readouterr().out.splitlines()
    lines = [json.loads(line) for line in out if line.startswith("{")]  # not cancel's line
    assert len(lines) == len(out) - 1
    assert lines[0]["job_id"] == job_id and "events" in lines[0]
    followed = lines[1:]
    assert followed and followed[-1]["type"] == "gfair.job.cancelled.v1"
    seen = {e["sequence"] for e in lines[0]["events"]}
    assert all(e["sequence"] not in seen for e in followed)


def publish(url: str, *events: EventData) -> None:
    """Publish what a node executor and the failure detector would say about a job."""

    async def send() -> None:
        bus = await NatsBus.connect(NatsOptions(servers=(url,), name="test-executor"))
        try:
            publisher = EventPublisher(bus, "test-executor")
            for event in events:
                await publisher.publish(event)
        finally:
            await bus.close()

    asyncio.run(send())


class Background:
    """`gfair ...` in a thread (it blocks until the job ends), with its exit code."""

    def __init__(self, gfair: Gfair, *argv: str) -> None:
        self.codes: list[int] = []
        argv = (*argv, "--nats", gfair.url) if "--" not in argv else argv
        self.thread = threading.Thread(target=lambda: self.codes.append(main(list(argv))))
        self.thread.start()

    def result(self) -> int:
        self.thread.join(20)
        assert not self.thread.is_alive()
        (code,) = self.codes
        return code


def final_json(out: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(out[out.rindex('{\n  "user"') :])
    return found


@pytest.mark.parametrize(
    ("ending", "code", "state"),
    [
        (lambda u, j: JobCompleted(user=u, job_id=j, attempt=1), 0, "completed"),
        (
            lambda u, j: JobFailed(
                user=u,
                job_id=j,
                attempt=1,
                failure_class=FailureClass.USER_ERROR,
                reason="exit status 3",
            ),
            1,
            "failed",
        ),
    ],
)
def test_wait_exits_with_the_outcome(
    gfair: Gfair, ending: Callable[[str, str], EventData], code: int, state: str
) -> None:
    job_id = gfair.submit("alice")["job_id"]
    waiting = Background(gfair, "wait", f"alice/{job_id}", "--json")
    consistently_sync(waiting.thread.is_alive, 1.0)  # the job has not ended: it waits
    publish(gfair.url, ending("alice", job_id))
    assert waiting.result() == code
    shown = final_json(gfair.capsys.readouterr().out)
    assert shown["state"] == state and shown["timed_out"] is False
    if state == "failed":
        assert shown["reason"] == "exit status 3"
    # A job that has already ended answers at once, the same way.
    assert gfair("wait", f"alice/{job_id}")[0] == code


def test_wait_on_a_cancelled_job_exits_5_and_a_timeout_4(gfair: Gfair) -> None:
    job_id = gfair.submit("alice")["job_id"]
    code, out, _ = gfair("wait", f"alice/{job_id}", "--timeout", "0.5")
    assert code == 4 and f"alice/{job_id}" in out and "still waiting" in out
    waiting = Background(gfair, "wait", job_id, "--user", "alice")
    assert gfair("cancel", f"alice/{job_id}", "--no-wait")[0] == 0
    assert waiting.result() == 5
    code, _, err = gfair("wait", "alice/never-submitted")
    assert code == 1 and "no job alice/never-submitted" in err


def test_submit_wait_completed_exits_with_the_outcome(gfair: Gfair) -> None:
    argv = ["submit", "--user", "bob", "--gpus", "1", "--job-id", "train-1", "--json"]
    submitting = Background(gfair, *argv, "--wait=completed", "--nats", gfair.url, *COMMAND)
    eventually_sync(lambda: gfair.json("jobs", "--user", "bob") != [])
    consistently_sync(submitting.thread.is_alive, 0.5)  # admitted, but not over
    publish(gfair.url, JobCompleted(user="bob", job_id="train-1", attempt=1))
    assert submitting.result() == 0
    shown = final_json(gfair.capsys.readouterr().out)
    assert shown["job_id"] == "train-1" and shown["state"] == "completed"

    argv[6] = "train-2"
    code, out, _ = gfair(*argv, "--wait=completed", "--timeout", "0.5", *COMMAND)
    assert code == 4
    shown = final_json(out)
    assert shown["job_id"] == "train-2" and shown["timed_out"] is True
    assert shown["state"] in ("queued", "placed", "submitted")


def test_history_and_usage_account_for_the_gpu_time(gfair: Gfair) -> None:
    job_id = gfair.submit("alice", "--gpus", "1")["job_id"]
    gfair.submit("bob")  # never runs: listed, no GPU time
    eventually_sync(lambda: gfair.json("job", f"alice/{job_id}")["record"]["servers"] != [])
    record = gfair.json("job", f"alice/{job_id}")["record"]
    node, pool = record["servers"][0], record["generation"]
    publish(
        gfair.url,
        JobStarted(user="alice", job_id=job_id, node_id=node, gpu_indices=(0,), attempt=1),
    )
    eventually_sync(lambda: gfair.json("job", f"alice/{job_id}")["state"] == "running")
    time.sleep(1.0)  # pause under test: it runs a while, so its history has a runtime
    publish(gfair.url, JobCompleted(user="alice", job_id=job_id, attempt=1))
    eventually_sync(lambda: gfair.json("job", f"alice/{job_id}")["state"] == "completed")

    (line,) = gfair.json("history", "--user", "alice", "--since", "1h")
    assert line["job_id"] == job_id and line["state"] == "completed"
    assert line["started_at"] and line["ended_at"] and line["wait_s"] >= 0
    ran_h = line["runtime_s"] / 3600
    assert set(line["gpu_hours"]) == {pool} and line["gpu_hours"][pool] == pytest.approx(ran_h)
    assert 1.0 / 3600 <= ran_h < 30.0 / 3600
    assert gfair.json("history", "--state", "completed") == [line]
    assert {j["user"] for j in gfair.json("history")} == {"alice", "bob"}
    assert gfair.json("history", "--until", "2000-01-01T00:00") == []

    users = {u["user"]: u for u in gfair.json("usage", "--windows", "1h,7d", "--half-life", "1d")}
    assert set(users) == {"alice", "bob"}
    assert users["alice"]["windows"]["1h"] == pytest.approx(ran_h)
    assert users["alice"]["gpu_hours"] == {pool: pytest.approx(ran_h)}
    assert users["alice"]["decayed_share"] == 1.0 and users["bob"]["decayed_gpu_hours"] == 0.0
    for argv in (("history",), ("usage",)):
        code, out, _ = gfair(*argv)
        assert code == 0 and "alice" in out

    assert line["held_s"] == pytest.approx(line["gpu_hours"][pool] * 3600)

    code, _, err = gfair("history", "--since", "yesterdayish")
    assert code == 2 and "--since 'yesterdayish': expected a time" in err
    code, _, err = gfair("usage", "--half-life", "0")
    assert code == 2 and "--half-life '0'" in err and "> 0" in err


def ship(url: str, user: str, job_id: str, *chunks: OutputChunk) -> None:
    """Publish output chunks as a node executor's shipper does."""

    async def send() -> None:
        bus = await NatsBus.connect(NatsOptions(servers=(url,), name="test-shipper"))
        try:
            for chunk in chunks:
                await publish_chunk(bus, user, job_id, chunk)
        finally:
            await bus.close()

    asyncio.run(send())


def test_logs_prints_the_output_and_follows_it_until_the_job_ends(gfair: Gfair) -> None:
    job_id = gfair.submit("alice")["job_id"]
    ship(
        gfair.url,
        "alice",
        job_id,
        OutputChunk("stdout", "v100-0", "run-0001", 0, b"epoch 1\n"),
        OutputChunk("stderr", "v100-0", "run-0001", 0, b"warning: slow\n"),
    )
    code, out, _ = gfair("logs", f"alice/{job_id}")
    assert code == 0 and out == "==> node v100-0, run-0001 <==\nepoch 1\nwarning: slow\n"
    code, out, _ = gfair("logs", job_id, "--user", "alice", "--output", "stderr", "--no-headers")
    assert code == 0 and out == "warning: slow\n"
    code, out, _ = gfair("logs", f"alice/{job_id}", "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(c["output"], c["text"], c["run"]) for c in lines] == [
        ("stdout", "epoch 1\n", "run-0001"),
        ("stderr", "warning: slow\n", "run-0001"),
    ]

    following = Background(gfair, "logs", f"alice/{job_id}", "-f")
    consistently_sync(following.thread.is_alive, 1.0)
    # Resumed on another node, then done: its output, the end of each run, the outcome.
    ship(
        gfair.url,
        "alice",
        job_id,
        OutputChunk("stdout", "k80-0", "run-0001", 0, b"epoch 2\n"),
        *(
            OutputChunk(o, n, "run-0001", 0, b"", True)
            for o in OUTPUTS
            for n in ("v100-0", "k80-0")
        ),
    )
    publish(gfair.url, JobCompleted(user="alice", job_id=job_id, attempt=1))
    assert following.result() == 0
    out = gfair.capsys.readouterr().out
    # Each run's output under a line naming its node and run.
    assert out.endswith(
        "==> node v100-0, run-0001 <==\nepoch 1\nwarning: slow\n"
        "==> node k80-0, run-0001 <==\nepoch 2\n"
    )

    code, _, err = gfair("logs", "alice/never-submitted")
    assert code == 1 and "no job alice/never-submitted" in err


def test_top_draws_the_shares_the_servers_and_the_counts(gfair: Gfair) -> None:
    job_id = gfair.submit("alice", "--job-type", "ResNet-50 (batch size 32)")["job_id"]
    gfair.submit("alice")  # still waiting: alice stays active after the first one ends
    gfair.submit("bob")
    eventually_sync(lambda: {u["user"] for u in gfair.json("users")["users"]} >= {"alice", "bob"})
    publish(gfair.url, JobCompleted(user="alice", job_id=job_id, attempt=1))
    eventually_sync(lambda: gfair.json("job", f"alice/{job_id}")["state"] == "completed")
    code, out, err = gfair("top", "--once", "--refresh", "0.1")
    assert code == 0, err
    assert "gfair top: 3 job(s)" in out
    assert "fair share" in out and "what runs where" in out
    users = [line for line in out.splitlines() if line.startswith(("│ alice", "│ bob"))]
    assert len(users) == 2
    assert "0/1/1" in users[0]  # alice: none running, one waiting, one done
    assert "completed 1" in out  # the lifecycle counts include the job that ended


def test_submit_from_a_spec_file_with_flags_overriding_it(gfair: Gfair, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "user: alice\ngpus: 1\nname: resnet\njob_id: from-file\n"
        "command: python -m gfair.sdk.synthetic --iterations 10\n"
        "env: {SEED: 1, MODE: fast}\nprepare: true\n"
    )
    submitted = gfair.json("submit", "-f", str(spec), "--env", "MODE=slow")
    assert (submitted["user"], submitted["job_id"]) == ("alice", "from-file")
    record = gfair.json("job", "alice/from-file")["record"]["submission"]
    assert record["command"] == COMMAND[1:]
    assert record["env"] == {"SEED": "1", "MODE": "slow"}  # the flag wins
    assert record["name"] == "resnet" and record["gpus"] == 1 and record["prepare"] is True
    override = gfair.json("submit", "-f", str(spec), "--job-id", "other", "--user", "bob")
    assert (override["user"], override["job_id"]) == ("bob", "other")

    spec.write_text("gpus: 1\ncomand: [python]\n")
    code, _, err = gfair("submit", "-f", str(spec), "--user", "alice")
    assert code == 2 and "comand: Extra inputs are not permitted" in err
    spec.write_text("user: alice\ncommand: [python]\n")
    code, _, err = gfair("submit", "-f", str(spec))
    assert code == 2 and "--gpus" in err


def test_why_says_which_pass_of_the_scheduler_placed_a_job(gfair: Gfair) -> None:
    # A job arriving between quanta on an idle cluster starts at once, on the fastest GPUs
    # left idle (the kernel's backfill); the job's history says so.
    job_id = gfair.submit("alice")["job_id"]

    def placed() -> bool:
        return "placed on v100" in gfair("why", f"alice/{job_id}")[1]

    eventually_sync(placed)
    code, out, _ = gfair("why", f"alice/{job_id}")
    assert code == 0
    assert "by the scheduler: backfill, v100 GPUs left idle between quanta" in out
