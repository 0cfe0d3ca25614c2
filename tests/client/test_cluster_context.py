"""Where a tool finds NATS: --nats, then $GFAIR_NATS_URL, then a running `gfair up`'s context
file, then the default; stale and broken context files are ignored."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gfair.cli.trace import default_span_file
from gfair.client import ConnectOptions
from gfair.client.cluster_context import (
    DEFAULT_NATS_URL,
    ClusterContext,
    locate_cluster,
    own_context,
    process_start_ticks,
    read_context,
    remove_context,
    remove_stale_contexts,
    running_context,
    user_context_path,
    write_context,
)
from gfair.embedded_cluster import Brokers


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh home and working directory, no URL exported, no credentials configured."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.delenv("GFAIR_SPAN_FILE", raising=False)
    for name in ("URL", "USER", "PASSWORD", "TOKEN", "CREDS", "NKEY_SEED"):
        monkeypatch.delenv(f"GFAIR_NATS_{name}", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return home


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def context_of(url: str, pid: int | None = None, **fields: str | None) -> ClusterContext:
    pid = os.getpid() if pid is None else pid
    return ClusterContext(nats_url=url, pid=pid, pid_started=process_start_ticks(pid), **fields)


def user_file(home: Path) -> Path:
    path = user_context_path()
    assert path is not None and path.is_relative_to(home)
    return path


def test_the_per_user_file_follows_xdg_state_home(
    home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    mine = f"clusters/{os.getpid()}.json"
    assert user_context_path() == home / ".local" / "state" / "gfair" / mine
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert user_context_path() == tmp_path / "state" / "gfair" / mine
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")  # invalid per the XDG spec
    assert user_context_path() == home / ".local" / "state" / "gfair" / mine


def test_without_anything_the_default_url(home: Path) -> None:
    address = locate_cluster()
    assert address.servers == (DEFAULT_NATS_URL,) and address.source == "the default"
    assert ConnectOptions().servers == (DEFAULT_NATS_URL,)


def test_a_running_up_is_found_through_its_context(home: Path) -> None:
    write_context(context_of("nats://127.0.0.1:40001"), [user_file(home)])
    address = locate_cluster()
    assert address.servers == ("nats://127.0.0.1:40001",)
    assert str(user_file(home)) in address.source
    assert ConnectOptions().servers == ("nats://127.0.0.1:40001",)


def test_the_environment_comes_before_the_context(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_context(context_of("nats://127.0.0.1:40001"), [user_file(home)])
    monkeypatch.setenv("GFAIR_NATS_URL", "nats://a:1, nats://b:2")
    assert locate_cluster().servers == ("nats://a:1", "nats://b:2")
    # --nats (servers given) comes before both.
    given = ConnectOptions(servers=("nats://c:3",))
    assert given.servers == ("nats://c:3",) and given.address.source == "the given URL"


def test_this_directorys_up_comes_before_the_users_latest(home: Path) -> None:
    write_context(context_of("nats://127.0.0.1:40001"), [user_file(home)])
    write_context(context_of("nats://127.0.0.1:40002"), [Path(".gfair/context.json")])
    assert locate_cluster().servers == ("nats://127.0.0.1:40002",)


def test_stale_and_broken_contexts_are_ignored(home: Path) -> None:
    local = Path(".gfair/context.json")
    write_context(context_of("nats://127.0.0.1:40001", pid=dead_pid()), [local])
    assert read_context(local) is not None and running_context() is None
    assert locate_cluster().servers == (DEFAULT_NATS_URL,)

    # A pid taken over by another process since: its start time tells them apart.
    reused = dataclasses.replace(context_of("nats://127.0.0.1:40001"), pid_started=1)
    write_context(reused, [local])
    if process_start_ticks(os.getpid()) is not None:
        assert running_context() is None

    user_file(home).parent.mkdir(parents=True)
    user_file(home).write_text("{not json")
    assert read_context(user_file(home)) is None
    user_file(home).write_text('{"version": 99, "nats_url": "nats://x:1", "pid": 1}')
    assert read_context(user_file(home)) is None
    assert locate_cluster().servers == (DEFAULT_NATS_URL,)


def test_context_credentials_apply_only_when_no_login_is_configured(
    home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    creds = tmp_path / "tool.creds"
    creds.write_text("")
    write_context(context_of("nats://127.0.0.1:40001", creds=str(creds)), [user_file(home)])
    assert ConnectOptions().connect_kwargs()["user_credentials"] == str(creds)
    assert "user_credentials" not in ConnectOptions(servers=("nats://c:3",)).connect_kwargs()
    explicit = ConnectOptions(user="alice", password="pw").connect_kwargs()
    assert "user_credentials" not in explicit and explicit["user"] == "alice"
    monkeypatch.setenv("GFAIR_NATS_TOKEN", "t0ken")
    assert "user_credentials" not in ConnectOptions().connect_kwargs()


def test_a_stopping_up_removes_only_its_own_context(home: Path, tmp_path: Path) -> None:
    mine = own_context("nats://127.0.0.1:40001", data_dir=tmp_path)
    assert mine.pid == os.getpid() and mine.running
    local, user = Path(".gfair/context.json").absolute(), user_file(home)
    assert write_context(mine, [local, user]) == [local, user]
    assert ClusterContext.from_json(local.read_text()) == mine
    # A later `gfair up` took this data dir's file over.
    theirs = context_of("nats://127.0.0.1:40002", pid=os.getppid())
    write_context(theirs, [local])
    remove_context([local, user], os.getpid())
    assert read_context(local) == theirs and not user.exists()


def test_two_ups_each_keep_their_file_and_the_one_left_running_is_found(home: Path) -> None:
    first = context_of("nats://127.0.0.1:40001", pid=os.getppid())
    first_file = user_context_path(pid=first.pid)
    assert first_file is not None
    write_context(first, [first_file])
    os.utime(first_file, (1, 1))  # written long before the second
    second = context_of("nats://127.0.0.1:40002")
    write_context(second, [user_file(home)])
    assert locate_cluster().servers == ("nats://127.0.0.1:40002",)  # the latest
    remove_context([user_file(home)], os.getpid())  # the second one stops
    assert read_context(first_file) == first
    assert locate_cluster().servers == ("nats://127.0.0.1:40001",)


def test_a_killed_ups_file_is_cleared_by_the_next_one(home: Path) -> None:
    gone = user_context_path(pid=dead_pid())
    assert gone is not None
    write_context(context_of("nats://127.0.0.1:40001", pid=int(gone.stem)), [gone])
    remove_stale_contexts()
    assert not gone.exists()


@pytest.mark.nats
def test_trace_reads_the_span_file_of_a_running_up(home: Path, tmp_path: Path) -> None:
    spans = tmp_path / "spans.jsonl"
    assert default_span_file() is None
    write_context(context_of("nats://127.0.0.1:40001", span_file=str(spans)), [user_file(home)])
    assert default_span_file() == spans


async def test_the_broker_takes_the_preferred_port_only_when_free(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        brokers = Brokers(tmp_path / "a", tmp_path / "a" / "logs")
        try:
            url = await brokers.start(1, preferred_port=taken)
            assert url.startswith("nats://127.0.0.1:") and not url.endswith(f":{taken}")
        finally:
            await brokers.stop()

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    brokers = Brokers(tmp_path / "b", tmp_path / "b" / "logs")
    try:
        assert await brokers.start(1, preferred_port=free) == f"nats://127.0.0.1:{free}"
    finally:
        await brokers.stop()
